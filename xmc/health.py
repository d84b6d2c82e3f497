"""Liveness endpoint for the web process (readiness joins with the API issue)."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})
