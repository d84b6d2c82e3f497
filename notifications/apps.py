"""The notifications app registers its consumer of committed transitions in ready().

It sits above ``workunits`` and ``experiments``: nothing below imports it;
it hears about committed state changes through ``workunits.hooks``.
"""
from __future__ import annotations

from django.apps import AppConfig

from delivery import sweep


class NotificationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "notifications"

    def ready(self) -> None:
        # Imported here: app modules may import models only once the registry is ready.
        from notifications import outbox, rest, services, sources, subscriptions
        from workunits import hooks
        from xmc.api import extensions

        # The one delivery sweep re-sends this app's two outboxes (events to fan out, deliveries).
        sweep.register("notification events", services.sweep_events)
        sweep.register("notification deliveries", services.sweep_deliveries)

        # The REST endpoints are mounted beside the API's bindings through its extension point.
        extensions.register(rest.urlpatterns, rest.openapi_paths)

        hooks.committed_hooks.register(sources.on_transitions_committed)
        hooks.scheduling_hooks.register(sources.on_scheduling_changed)
        hooks.advisory_hooks.register(sources.on_advisories)
        # The admin's "send again" of a delivery's dead letter (the one dead-letter list, in workunits).
        hooks.dead_letter_requeuers.register(outbox.DEAD_LETTER_SOURCE, subscriptions.send_again)
