"""The usage app: GPU- and CPU-hours per running interval, rolled up (docs/architecture/usage.md).

It sits beside ``k8s_bridge`` and ``notifications``: it reads work units (their
state history, through the rows its triggers keep), experiments and the metric
store, and serves ``GET /v1/usage`` through `xmc.api.extensions`.
"""
from __future__ import annotations

from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "usage"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from usage import views
        from xmc.api import extensions

        extensions.register(views.urlpatterns, views.openapi_paths)
