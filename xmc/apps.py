"""The project app: its ready() registers the RPC handlers, the system checks and the auth signals."""
from __future__ import annotations

from django.apps import AppConfig


class XmcConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "xmc"

    def ready(self) -> None:
        from xmc import checks  # noqa: F401 - registers the system checks
        from xmc.api import handlers  # noqa: F401 - registers every RPC into xmc.api.registry.RPCS
        from xmc.api import dashboards  # noqa: F401 - and the DashboardService's
        from xmc.auth import signals

        signals.connect()

        # A user or group change in this process reaches the identity cache at
        # once (other processes see it within XMC_IDENTITY_CACHE_S).
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group
        from django.db.models.signals import m2m_changed, post_delete, post_save

        from xmc.auth.identity import clear_identity_cache

        user_model = get_user_model()
        for model in (user_model, Group):
            post_save.connect(clear_identity_cache, sender=model, dispatch_uid=f"xmc.identity_cache.save.{model.__name__}")
            post_delete.connect(clear_identity_cache, sender=model,
                                dispatch_uid=f"xmc.identity_cache.delete.{model.__name__}")
        m2m_changed.connect(clear_identity_cache, sender=user_model.groups.through,
                            dispatch_uid="xmc.identity_cache.groups")
