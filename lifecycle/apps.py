"""The lifecycle app registers into the hooks of the apps below it (``workunits.hooks``, ``artifacts.hooks``)."""
from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


class LifecycleConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "lifecycle"

    def ready(self) -> None:
        # Imported here: app modules may import models only once the registry is ready.
        from artifacts import hooks as artifact_hooks
        from lifecycle import services, stamping
        from workunits import hooks as workunit_hooks

        workunit_hooks.superseded_hooks.register(services.on_execution_superseded)
        workunit_hooks.set_notify_when_provider(stamping.notify_when_for)
        artifact_hooks.attached_hooks.register(stamping.on_artifact_attached)
        checks.register(check_lifecycle_configuration)


def check_lifecycle_configuration(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Start-up check: with the flag on, the MachineLearningRun project and location must be set."""
    from lifecycle import rules  # the app registry is ready when checks run

    try:
        rules.check_configuration()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="lifecycle.E001")]
    return []
