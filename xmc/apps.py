from __future__ import annotations

from django.apps import AppConfig


class XmcConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "xmc"

    def ready(self) -> None:
        from xmc import checks  # noqa: F401 - registers the system checks
        from xmc.auth import signals

        signals.connect()
