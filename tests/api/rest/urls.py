"""URLconf for the REST tests: the API and the operator endpoints, as ``xmc.urls`` will mount them."""
from __future__ import annotations

from django.urls import URLPattern, URLResolver, include, path

from xmc import ops

urlpatterns: list[URLPattern | URLResolver] = [
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("", include("xmc.api.rest_urls")),
]
