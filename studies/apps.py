"""The studies app registers into the hooks of the apps below it (``workunits.hooks``, ``metrics.hooks``);
the apps above register into its own (``studies.hooks``)."""
from __future__ import annotations

from django.apps import AppConfig


class StudiesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "studies"

    def ready(self) -> None:
        # Imported here: app modules may import models only once the registry is ready.
        from metrics import hooks as metric_hooks
        from studies import controller
        from workunits import hooks as workunit_hooks

        metric_hooks.written_hooks.register(controller.on_points_written)
        workunit_hooks.committed_hooks.register(controller.on_transitions_committed)
