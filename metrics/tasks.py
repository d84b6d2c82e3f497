"""Celery tasks of the metrics app: the points table's daily partitions, and the system metrics.

The partitions run hourly from the beat schedule (``CELERY_BEAT_SCHEDULE`` in
``xmc/settings.py``) on the actuator queue, beside the other clean-ups; a thin
adapter over `metrics.partitions.maintain`, idempotent (a second run finds
every partition there and nothing old enough).
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone

from core.queues import Queue
from delivery import declare
from metrics import partitions, services, system


@declare.task(name="xmc.metrics.maintain_partitions", queue=Queue.ACTUATOR, time_limit=600, hard_time_limit=660)
def maintain_partitions() -> dict[str, Any]:
    """Create today's and the next ``XMC_METRICS_PARTITIONS_AHEAD_DAYS`` days' partitions; delete points
    more than ``XMC_METRICS_MAX_FUTURE_S`` ahead; drop the ones wholly older than
    ``XMC_METRICS_RETENTION_DAYS`` (0 keeps them for ever)."""
    done = partitions.maintain(timezone.now(), days_ahead=settings.XMC_METRICS_PARTITIONS_AHEAD_DAYS,
                               retention_days=settings.XMC_METRICS_RETENTION_DAYS,
                               max_future_s=settings.XMC_METRICS_MAX_FUTURE_S)
    return {"created": done.created, "dropped": done.dropped, "default_deleted": done.default_deleted,
            "blocks_deleted": done.blocks_deleted, "future_deleted": done.future_deleted}


@declare.task(name="xmc.metrics.collect_system", queue=Queue.ACTUATOR, time_limit=120)
def collect_system() -> dict[str, Any]:
    """One cycle of the system metrics (`metrics.system.collect`): every ``XMC_SYSTEM_METRICS_INTERVAL_S``
    from the beat schedule, idempotent (a second run within one interval writes nothing new)."""
    done = system.collect()
    return {"executions": done.executions, "measured": done.measured, "points": done.points,
            "advisories": done.advisories, "seconds": round(done.total_s, 3)}


@declare.task(name="xmc.metrics.roll_up_blocks", queue=Queue.ACTUATOR, time_limit=300, hard_time_limit=360)
def roll_up_blocks() -> dict[str, Any]:
    """Every ``XMC_METRICS_ROLL_UP_S`` from the beat schedule: the pending finest blocks into their coarser
    sizes (`metrics.services.roll_up_blocks`; idempotent: a second run finds nothing pending)."""
    return {"blocks": services.roll_up_blocks()}
