"""URL root: admin, health, and (later) the REST API and login flow."""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from xmc import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("api/cli/", include("xmc.auth.urls")),
]
