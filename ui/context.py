"""Template context every page gets: whether work waits for a worker, or a process of ``./dev run``
is down (the quiet banner of base.html).

Registered in ``TEMPLATES`` (``xmc.settings``). Reads
``workunits.delivery.oldest_pending`` at most once per :data:`CACHE_S` per
process, so a busy page costs no extra query; a failed read shows no banner.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
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


#: What waits while a process is down, in the banner's words.
WAITS = {
    "worker": "launches, stops and notifications wait for it",
    "reconciler": "states shown here are not updated until it is back",
    "beat": "periodic sweeps and clean-ups wait for it",
    "grpc": "launches and the xmanager client cannot reach the API",
    "simulator": "the cluster does not answer",
}


def down_text(now: float | None = None) -> str:
    """``the worker is not running (for 12 s; ./dev run is starting it again): launches ... wait for it``,
    from the run folder's ``down.json`` that ``scripts/run_all.py`` keeps while it restarts a process
    ("" when nothing is down, or when no ``./dev run`` supervises this web: a deployment's processes
    are restarted by Kubernetes, and the delivery gauge and ``/readyz`` say what waits)."""
    try:
        down = json.loads((Path(settings.XMC_RUN_DIR) / "down.json").read_text())
    except (OSError, ValueError):
        return ""
    now = time.time() if now is None else now
    parts = []
    for name, info in sorted(down.items()):
        since = max(0, int(now - float((info or {}).get("since") or now)))
        what = WAITS.get(name, "")
        parts.append(f"the {name} is not running (for {since} s; ./dev run is starting it again)"
                     + (f": {what}" if what else ""))
    return "; ".join(parts)


def delivery(request: HttpRequest) -> dict[str, Any]:
    """``degraded``: the banner's text (a process down, work waiting past ``XMC_DEGRADED_AFTER_S``), else ""."""
    if not request.path.startswith(("/experiments", "/dashboards", "/subscriptions")):
        return {"degraded": ""}
    age = _oldest()
    texts = [down_text(), waiting_text(age) if age > settings.XMC_DEGRADED_AFTER_S else ""]
    return {"degraded": "; ".join(t for t in texts if t)}
