from __future__ import annotations

from django.apps import AppConfig


class K8sBridgeConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "k8s_bridge"

    def ready(self) -> None:
        # The execution-logs endpoint reads the cluster, so it lives here and is
        # mounted beside the API's bindings through the API's extension point.
        from k8s_bridge.logs import views
        from xmc.api import extensions

        extensions.register(views.urlpatterns, views.openapi_paths)
        # So are the Kueue queues (k8s_bridge.queues): quota, usage and pending workloads.
        from k8s_bridge.queues import views as queue_views

        extensions.register(queue_views.urlpatterns, queue_views.openapi_paths)
        # How a failed execution's containers ended (exit code, reason, last log line), from
        # the log archive, else the cluster: what the notifications put in a failure message.
        from k8s_bridge.logs import endings
        from workunits import hooks

        hooks.set_termination_provider(endings.terminations)
