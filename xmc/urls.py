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
    # Above the API's catch-all 404; a string include: xmc imports nothing of the app above it.
    path("", include("notifications.urls")),
    path("", include("xmc.api.rest_urls")),
]
