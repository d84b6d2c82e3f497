from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class LifecycleConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "lifecycle"

    def ready(self) -> None:
        from lifecycle import hooks

        if hooks._close_superseded not in hooks.superseded_hooks:
            hooks.superseded_hooks.append(hooks._close_superseded)
        checks.register(check_lifecycle_configuration)


def check_lifecycle_configuration(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Start-up check: with the flag on, the MachineLearningRun project and location must be set."""
    from django.core.exceptions import ImproperlyConfigured

    from lifecycle import rules

    try:
        rules.check_configuration()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="lifecycle.E001")]
    return []
