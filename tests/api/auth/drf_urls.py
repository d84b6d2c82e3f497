"""URLconf for the DRF identity tests: one tiny view behind our authentication."""
from __future__ import annotations

from django.urls import URLPattern, path

from tests.api.auth.test_drf_auth import WhoAmIView

urlpatterns: list[URLPattern] = [path("whoami", WhoAmIView.as_view())]
