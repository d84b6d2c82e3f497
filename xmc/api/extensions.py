"""Endpoints that apps above the API register beside it (the doors stay below them).

An app on a higher floor -- ``k8s_bridge``, whose execution-logs endpoint
needs the cluster -- adds its URL patterns and its OpenAPI paths here from its
``AppConfig.ready()``, as ``lifecycle`` registers into ``workunits.hooks``;
the researcher's pages (``ui``) add theirs at the site root (`site_urlpatterns`).
``xmc.api.rest_urls`` mounts `urlpatterns` before the API's catch-all 404 and
`xmc.api.openapi.build_document` adds every `openapi_paths` provider's paths.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.urls import URLPattern

#: URL patterns served under ``/v1/`` next to the RPC bindings.
urlpatterns: list[URLPattern] = []
#: URL patterns served at the site root (the researcher's pages, ``ui``), after the API's.
site_urlpatterns: list[URLPattern] = []
#: Request paths served on the event loop by Django's ASGI handler (``xmc.asgi``): the pages' event streams.
async_paths: list[re.Pattern[str]] = []
#: Callables that answer OpenAPI ``paths`` entries for those patterns.
openapi_paths: list[Callable[[], dict[str, Any]]] = []


def register(patterns: list[URLPattern], paths: Callable[[], dict[str, Any]]) -> None:
    """Serve ``patterns`` and document them with ``paths`` (idempotent per pattern list)."""
    for pattern in patterns:
        if pattern not in urlpatterns:
            urlpatterns.append(pattern)
    if paths not in openapi_paths:
        openapi_paths.append(paths)


def register_site(patterns: list[URLPattern]) -> None:
    """Serve ``patterns`` at the site root (idempotent per pattern)."""
    for pattern in patterns:
        if pattern not in site_urlpatterns:
            site_urlpatterns.append(pattern)


def register_async_paths(pattern: re.Pattern[str]) -> None:
    """Have ``xmc.asgi`` serve paths matching ``pattern`` with async views (no thread while open)."""
    if pattern not in async_paths:
        async_paths.append(pattern)
