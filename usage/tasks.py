"""Celery task of the usage app: settle the GPU utilisation of running intervals that have ended.

Runs every minute from the beat schedule (``CELERY_BEAT_SCHEDULE`` in
``xmc/settings.py``) on the actuator queue; a thin adapter over
`usage.services.settle`, idempotent. Until an interval is settled,
``/v1/usage`` weighs it by the execution's mean utilisation so far, so a late
or missed run changes no figure by much (docs/architecture/usage.md).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from celery import shared_task

from core.queues import Queue
from usage import services

#: ``shared_task`` with a type (Celery ships none).
_task = cast("Callable[..., Callable[[Callable[..., Any]], Any]]", shared_task)


@_task(name="xmc.usage.settle", queue=Queue.ACTUATOR.value, ignore_result=True,
             soft_time_limit=120, time_limit=150)
def settle() -> int:
    """Settle up to `usage.services.SETTLE_BATCH` ended intervals; how many were settled."""
    return services.settle()
