"""Endpoints that apps above the API register beside it (the doors stay below them).

An app on a higher floor -- ``k8s_bridge``, whose execution-logs endpoint
needs the cluster -- adds its URL patterns and its OpenAPI paths here from its
``AppConfig.ready()``, as ``lifecycle`` registers into ``workunits.hooks``.
``xmc.api.rest_urls`` mounts `urlpatterns` before the API's catch-all 404 and
`xmc.api.openapi.build_document` adds every `openapi_paths` provider's paths.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.urls import URLPattern

#: URL patterns served under ``/v1/`` next to the RPC bindings.
urlpatterns: list[URLPattern] = []
#: Callables that answer OpenAPI ``paths`` entries for those patterns.
openapi_paths: list[Callable[[], dict[str, Any]]] = []


def register(patterns: list[URLPattern], paths: Callable[[], dict[str, Any]]) -> None:
    """Serve ``patterns`` and document them with ``paths`` (idempotent per pattern list)."""
    for pattern in patterns:
        if pattern not in urlpatterns:
            urlpatterns.append(pattern)
    if paths not in openapi_paths:
        openapi_paths.append(paths)
