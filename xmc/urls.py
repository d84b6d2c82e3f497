"""URL root: admin, ops endpoints, the login flow and the REST API (/v1/...)."""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from xmc import ops

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("api/cli/", include("xmc.auth.urls")),
    path("", include("xmc.api.rest_urls")),
]
