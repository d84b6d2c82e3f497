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

import base64
import logging
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet

from workunits.models import Operation
from xmc import task_signing
from xmc.celery import Queue, app
from xmc.protos import task_pb2

log = logging.getLogger(__name__)


def deliver(operation_ids: Sequence[int]) -> None:
    """Hand committed operations to the actuator queue.

    The actuator issue replaces the body with the signed-task send; it must
    set ``dispatched_time`` only after the broker accepted the task and call
    ``workunits.services.record_enqueue_failure`` when it could not.
    """
    log.debug("outbox.deliver.no_actuator", extra={"operation_ids": list(operation_ids)})


#: The actuator's Celery task for each Task type (one positional argument:
#: the signed, serialized Task as base64 text).
ACTUATOR_TASK_NAMES: dict[int, str] = {
    task_pb2.Task.CREATE: "xmc.actuator.create",
    task_pb2.Task.DELETE: "xmc.actuator.delete",
    task_pb2.Task.RESTART: "xmc.actuator.restart",
    task_pb2.Task.UPDATE: "xmc.actuator.update",
}


def encode_task(task: task_pb2.Task) -> str:
    return base64.b64encode(task.SerializeToString(deterministic=True)).decode("ascii")


def decode_task(text: str) -> task_pb2.Task:
    """The inverse of :func:`encode_task` (raises ``InvalidTask`` on garbage)."""
    try:
        payload = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise task_signing.InvalidTask(f"task payload is not base64: {exc}") from exc
    return task_signing.decode(payload)


def publish(task: task_pb2.Task) -> None:
    """Sign ``task`` (fresh expiry) and hand it to the broker.

    Raises when the broker does not take it; callers that must not lose it
    rely on the Operation row (outbox) or the PausedTask row staying behind.
    """
    task_signing.sign(task)
    app.send_task(ACTUATOR_TASK_NAMES[task.type], args=[encode_task(task)], queue=Queue.ACTUATOR.value)


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
