"""Celery tasks of the work units app: resumption runs and the paused-task clean-up.

Thin adapters over ``workunits.resumption``. ``xmc.resumption.run`` is started
by ``workunits.scheduling.resume`` (admin, REST); ``xmc.resumption.cleanup``
runs hourly from the beat schedule (``CELERY_BEAT_SCHEDULE`` in
``xmc/settings.py``). Both are idempotent: a redelivered run finds the rows
already processed (or locked by its twin) and ends.
"""
from __future__ import annotations

from celery import shared_task

from core.queues import Queue
from workunits import resumption


@shared_task(name="xmc.resumption.run", queue=Queue.RESUMPTION.value, ignore_result=True,
             acks_late=True, soft_time_limit=1800, time_limit=1900)
def resumption_run(run_id: str, batch_size: int) -> dict[str, object]:
    summary = resumption.run(run_id, batch_size=batch_size)
    return {"run_id": str(summary.run_id), "resumed": summary.resumed, "skipped": summary.skipped,
            "interrupted": summary.interrupted}


@shared_task(name="xmc.resumption.cleanup", queue=Queue.RESUMPTION.value, ignore_result=True,
             acks_late=True, soft_time_limit=300, time_limit=360)
def paused_task_cleanup() -> int:
    return resumption.delete_expired()
