from __future__ import annotations

from django.apps import AppConfig

from delivery import sweep


class WorkunitsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "workunits"

    def ready(self) -> None:
        # The one sweep (delivery.sweep) re-sends this app's two outboxes.
        from workunits import delivery, outbox

        sweep.register("operations", outbox.sweep_operations)
        sweep.register("messages", delivery.sweep_messages)
