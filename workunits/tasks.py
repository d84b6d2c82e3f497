"""Celery tasks of the work units app: resumption runs and the paused-task clean-up.

Thin adapters over ``workunits.resumption``. ``xmc.resumption.run`` is started
by ``workunits.scheduling.resume`` (admin, REST); ``xmc.resumption.cleanup``
runs hourly from the beat schedule (``CELERY_BEAT_SCHEDULE`` in
``xmc/settings.py``). Both are idempotent: a redelivered run finds the rows
already processed (or locked by its twin) and ends.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from core.queues import Queue
from delivery import declare
from delivery.backoff import jittered
from workunits import delivery, resumption


@declare.task(name="xmc.resumption.run", queue=Queue.RESUMPTION, bind=True, time_limit=1800,
              hard_time_limit=1900)
def resumption_run(self: Any, run_id: str, batch_size: int, delivery_id: int | None = None) -> None:
    """One resumption run; its OutboxMessage (``delivery_id``) is claimed, retried on database errors."""
    def run() -> None:
        summary = resumption.run(run_id, batch_size=batch_size)
        resumption.log.info("resumption.run_done", extra={
            "run_id": str(summary.run_id), "resumed": summary.resumed, "skipped": summary.skipped,
            "interrupted": summary.interrupted})

    delivery.consume(self, delivery_id, run, retry_for=(DatabaseError,), max_retries=20,
                     backoff=lambda n: jittered(n, base=1.0, cap=60.0))


@declare.task(name="xmc.delivery.purge", queue=Queue.ACTUATOR, time_limit=60)
def purge_messages() -> int:
    """Delete done outbox messages ``XMC_OUTBOX_MESSAGE_RETENTION_DAYS`` after they ended."""
    return delivery.purge_messages(
        older_than=timezone.now() - timedelta(days=settings.XMC_OUTBOX_MESSAGE_RETENTION_DAYS))


@declare.task(name="xmc.resumption.cleanup", queue=Queue.RESUMPTION, time_limit=300,
              hard_time_limit=360)
def paused_task_cleanup() -> int:
    return resumption.delete_expired()
