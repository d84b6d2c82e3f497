"""The one seam between studies and the delivery mechanism (today ``workunits.delivery``).

Everything the study controller is asked to do is a step of one study
(`studies.controller.step`), recorded as an outbox row first and re-sent until a
worker finished it. When the delivery mechanism moves (to its own app), only the
import below changes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from core.queues import Queue
from workunits import delivery  # the one line to change when the delivery mechanism moves

#: The Celery task of a study step (``studies.tasks.step``); it rides the lifecycle queue's workers.
STEP_TASK = "xmc.studies.step"
QUEUE = Queue.LIFECYCLE.value
MAX_RETRIES = 50


def ring(study_id: int, *, committed: bool = False) -> None:
    """Ask for one step of study ``study_id``: an outbox row, sent after the current transaction commits
    (``committed``: the caller has committed already: written and sent now)."""
    delivery.enqueue(QUEUE, STEP_TASK, [int(study_id)], committed=committed)


def pending(study_ids: list[int]) -> set[int]:
    """Those of ``study_ids`` that have a step recorded and not yet finished (no need to ring again)."""
    rows = delivery.OutboxMessage.objects.filter(task_name=STEP_TASK, done=False).values_list("args", flat=True)
    wanted = set(study_ids)
    return {int(args[0]) for args in rows if args and int(args[0]) in wanted}


def answer(celery_task: Any, delivery_id: int | None, run: Callable[[], None]) -> None:
    """Run one step message at most once in effect (claim, heartbeat, retry, finish or dead-letter)."""
    delivery.consume(celery_task, delivery_id, run, retry_for=(DatabaseError,), max_retries=MAX_RETRIES)
