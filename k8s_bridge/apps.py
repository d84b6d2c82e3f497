from __future__ import annotations

from django.apps import AppConfig


class K8sBridgeConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "k8s_bridge"
