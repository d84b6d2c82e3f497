"""Template context every page gets: whether work waits for a worker (the quiet banner of base.html).

Registered in ``TEMPLATES`` (``xmc.settings``). Reads
``workunits.delivery.oldest_pending`` at most once per :data:`CACHE_S` per
process, so a busy page costs no extra query; a failed read shows no banner.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from workunits.delivery import oldest_pending

log = logging.getLogger(__name__)

CACHE_S = 5.0
_lock = threading.Lock()
_cached: tuple[float, float] = (-1e9, 0.0)  # (monotonic time read, oldest age then)


def _oldest() -> float:
    global _cached
    now = time.monotonic()
    with _lock:
        read_at, age = _cached
        if now - read_at < CACHE_S:
            return age + (now - read_at)
    try:
        age = max(oldest_pending().values(), default=0.0)
    except Exception:  # noqa: BLE001 - a page never fails for the banner's sake
        log.warning("ui.delivery_unavailable", exc_info=True)
        age = 0.0
    with _lock:
        _cached = (now, age)
    return age


def waiting_text(age_s: float) -> str:
    """``work is waiting for a worker: oldest 4 min``."""
    minutes = int(age_s // 60)
    return f"work is waiting for a worker: oldest {minutes} min" if minutes else \
        f"work is waiting for a worker: oldest {int(age_s)} s"


def delivery(request: HttpRequest) -> dict[str, Any]:
    """``degraded``: the banner's text past ``XMC_DEGRADED_AFTER_S``, else ""."""
    if not request.path.startswith(("/experiments", "/dashboards", "/subscriptions")):
        return {"degraded": ""}
    age = _oldest()
    return {"degraded": waiting_text(age) if age > settings.XMC_DEGRADED_AFTER_S else ""}
