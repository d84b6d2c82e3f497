"""The researcher's pages register their URLs and their publisher of committed transitions in ready().

The top floor: it imports every app below and nothing imports it. The URLs
are mounted at the site root through ``xmc.api.extensions.site_urlpatterns``
(``xmc.urls`` includes them), ``ui.live.publish`` hears of committed
state changes through ``workunits.hooks.committed_hooks``, as notifications do,
``ui.live.publish_metrics`` of new metric points through
``metrics.hooks.written_hooks``, and ``ui.live.publish_study`` of committed
changes of a study's trials through ``studies.hooks.changed_hooks``.
"""
from __future__ import annotations

from django.apps import AppConfig


class UiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "ui"

    def ready(self) -> None:
        # Imported here: the URLconf's views import models, only once the registry is ready.
        from metrics import hooks as metrics_hooks
        from studies import hooks as studies_hooks
        from ui import live, urls
        from workunits import hooks
        from xmc.api import extensions

        extensions.register_site(urls.urlpatterns)
        extensions.register_async_paths(urls.EVENT_PATHS)
        hooks.committed_hooks.register(live.publish)
        metrics_hooks.written_hooks.register(live.publish_metrics)
        studies_hooks.changed_hooks.register(live.publish_study)
