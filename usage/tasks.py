"""Celery task of the usage app: settle the GPU utilisation of running intervals that have ended.

Runs every minute from the beat schedule (``CELERY_BEAT_SCHEDULE`` in
``xmc/settings.py``) on the actuator queue; a thin adapter over
`usage.services.settle`, idempotent. Until an interval is settled,
``/v1/usage`` weighs it by the execution's mean utilisation so far, so a late
or missed run changes no figure by much (docs/architecture/usage.md).
"""
from __future__ import annotations

from core.queues import Queue
from delivery import declare
from usage import services


@declare.task(name="xmc.usage.settle", queue=Queue.ACTUATOR, time_limit=120)
def settle() -> int:
    """Settle up to `usage.services.SETTLE_BATCH` ended intervals; how many were settled."""
    return services.settle()
