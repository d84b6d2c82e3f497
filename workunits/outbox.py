"""The seam between committed operations and the worker processes.

Services call ``send_on_commit(operation_ids)`` inside their transaction; the
ids are handed to ``deliver`` only after the transaction commits, so nothing
uncommitted is ever sent. The Operation row is the outbox: an operation that
is not done and has no ``dispatched_time`` has not reached the broker, and
the periodic sweep (actuator issue) re-sends every row from
``undispatched_operations``. Until the actuator exists, ``deliver`` only
logs, and operations stay pending, which is the truth.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet

from workunits.models import Operation

log = logging.getLogger(__name__)


def deliver(operation_ids: Sequence[int]) -> None:
    """Hand committed operations to the actuator queue.

    The actuator issue replaces the body with the signed-task send; it must
    set ``dispatched_time`` only after the broker accepted the task and call
    ``workunits.services.record_enqueue_failure`` when it could not.
    """
    log.debug("outbox.deliver.no_actuator", extra={"operation_ids": list(operation_ids)})


def send_on_commit(operation_ids: Sequence[int]) -> None:
    ids = list(operation_ids)
    if ids:
        transaction.on_commit(lambda: _deliver_safely(ids))


def _deliver_safely(ids: list[int]) -> None:
    try:
        deliver(ids)
    except Exception:
        # The rows stay undispatched: the sweep re-sends them.
        log.exception("outbox.deliver_failed", extra={"operation_ids": ids})


def undispatched_operations(created_before: datetime) -> QuerySet[Operation]:
    """Operations a sweep must re-send: not done, never accepted by the broker."""
    return Operation.objects.filter(
        done=False, dispatched_time__isnull=True, create_time__lt=created_before
    ).exclude(task_type="").order_by("create_time")
