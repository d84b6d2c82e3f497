"""URL root: admin, ops endpoints, the login flow, the REST API (/v1/...) and the pages apps above register."""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from xmc import ops
from xmc.api import extensions

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("favicon.ico", ops.favicon, name="favicon"),
    path("api/cli/", include("xmc.auth.urls")),
    path("", include("xmc.api.rest_urls")),
    # The researcher's pages (ui), registered from its AppConfig.ready(): /experiments, /login.
    path("", include(extensions.site_urlpatterns)),
]
