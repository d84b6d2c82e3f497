"""The delivery floor's one periodic task: ``xmc.delivery.sweep`` (see ``delivery.sweep``)."""
from __future__ import annotations

from celery import shared_task

from core.queues import Queue
from delivery import sweep as sweeps


@shared_task(name="xmc.delivery.sweep", queue=Queue.ACTUATOR.value, ignore_result=True,
             soft_time_limit=120, time_limit=150)
def sweep() -> dict[str, int]:
    """Re-send every table's rows never sent, or whose lease ran out."""
    return sweeps.sweep()
