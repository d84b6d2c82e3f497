"""URLs of the `xmanager login` flow (filled in by the identity work)."""
from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
