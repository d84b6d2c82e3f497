"""Run one actuator task: verify, hold if paused, skip if cancelled, handle, classify.

The Celery tasks in ``k8s_bridge.tasks`` are one line each around
:func:`run`. Order of business:

1. decode and verify the signature (``core.task_wire``); an unsigned,
   tampered, expired or unknown-key task, or one sent under the wrong task
   name, is dead-lettered and never reaches the cluster;
2. Create/Restart/Update: ``pause.hold_if_paused`` (the task is stored, done);
3. the Operation row: already done -> return quietly (a redelivery);
   a Create/Restart whose cancellation was requested ends CANCELLED;
   then the handler runs under ``delivery.consume.consume``: the row is
   claimed (a copy whose operation another live run holds is dropped, one
   whose claim ran out takes it over), the claim is kept alive while the
   handler works and pushed past a retry's countdown;
4. the handler; ``RetryLater`` and retryable errors come back through a
   Celery retry with ``delivery.backoff.jittered``; a permanent error, or a
   retryable one past ``XMC_ACTUATOR_MAX_RETRIES``, completes the operation
   with the error, writes a DeadLetter row and moves the execution (FAILED
   for a Create/Restart still being handed over) in one transaction; each
   retry first leaves a WARNING on the execution saying so
   (``workunits.services.failures``).
"""
from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from core import names, task_wire
from core.errors import InvalidArgument
from core.protos import task_pb2
from k8s_bridge.actuator import pause
from k8s_bridge.actuator.handlers import HANDLERS, RetryLater
from delivery.backoff import jittered
from delivery.consume import Retry, consume
from k8s_bridge.errors import classify, retry_after_seconds
from workunits import services
from workunits.models import Operation

log = logging.getLogger(__name__)

_PAUSABLE = (task_pb2.Task.CREATE, task_pb2.Task.RESTART, task_pb2.Task.UPDATE)
_CANCELLABLE = (task_pb2.Task.CREATE, task_pb2.Task.RESTART)


@dataclass(frozen=True)
class OperationView:
    id: int
    done: bool
    requested_cancellation: bool


def operation_of(task: task_pb2.Task) -> OperationView | None:
    """The Operation row a (verified) task stands for, when it names one that matches it."""
    try:
        xid, wid, op_id = names.parse_operation(task.operation_name, "operation_name")
    except InvalidArgument:
        return None  # no operation, or a name of another shape: nothing to link
    if xid != task.xid or (wid is not None and wid != task.wid):
        return None
    row = Operation.objects.filter(id=op_id, experiment_id=xid).values("done", "requested_cancellation").first()
    if row is None:
        return None
    return OperationView(op_id, bool(row["done"]), bool(row["requested_cancellation"]))


def _raw(payload: str) -> bytes:
    try:
        return base64.b64decode(payload.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        return payload.encode("utf-8", "replace")


def run(celery_task: Any, payload: str, expected: int) -> None:
    name = task_wire.ACTUATOR_TASK_NAMES[expected]
    type_name = task_pb2.Task.Type.Name(expected)
    attempts = int(getattr(celery_task.request, "retries", 0) or 0) + 1
    try:
        task = task_wire.decode_task(payload)
        task_wire.verify(task)
        if task.type != expected:
            raise task_wire.InvalidTask(f"a {task_pb2.Task.Type.Name(task.type)} task sent as {name}")
    except task_wire.InvalidTask as exc:
        log.warning("actuator.invalid_task", extra={"task": name, "error": str(exc)})
        c = classify(exc)
        services.record_dead_letter(task_name=name, task_type=type_name, payload=_raw(payload), operation_id=None,
                                    error_code=c.code, error_message=c.message, attempts=attempts)
        return

    if task.type in _PAUSABLE and pause.hold_if_paused(task):
        return
    op = operation_of(task)
    operation_id = op.id if op is not None else None
    if op is not None:
        if op.done:
            return  # a redelivery of finished work
        if op.requested_cancellation and task.type in _CANCELLABLE and services.cancel_pending_operation(op.id):
            return

    def retry_in(exc: Exception, retries: int) -> Retry | None:
        if isinstance(exc, RetryLater):
            countdown = jittered(retries, base=0.5, cap=10.0)
            log.info("actuator.wait", extra={"task": name, "reason": str(exc), "countdown": countdown})
            return Retry(countdown, settings.XMC_ACTUATOR_RESTART_WAIT_RETRIES)
        c = classify(exc)
        if c.permanent or retries >= settings.XMC_ACTUATOR_MAX_RETRIES:
            return None
        countdown = jittered(retries, base=settings.XMC_ACTUATOR_BACKOFF_BASE_S, cap=settings.XMC_ACTUATOR_BACKOFF_MAX_S)
        countdown = max(countdown, retry_after_seconds(exc) or 0.0)  # the API server asked us to wait
        _tell_retry(operation_id, services.Refusal(c.code, c.message, attempts), countdown)
        return Retry(countdown, settings.XMC_ACTUATOR_MAX_RETRIES)

    def give_up(exc: Exception, tries: int) -> None:
        if isinstance(exc, RetryLater):
            refusal = services.Refusal("DEADLINE_EXCEEDED", str(exc), tries)
        else:
            c = classify(exc)
            refusal = services.Refusal(c.code, c.message, tries, c.permanent)
        _give_up(task, name, payload, operation_id, refusal)

    consume(celery_task, Operation if operation_id is not None else None, operation_id,
            lambda: HANDLERS[task.type](task, operation_id), retry_in=retry_in, give_up=give_up)


def _tell_retry(operation_id: int | None, refusal: services.Refusal, countdown: float) -> None:
    """The execution carries a WARNING while we retry (``workunits.services.record_actuator_retry``).

    Best effort: a failed write is logged, the retry goes ahead regardless."""
    if operation_id is None:
        return
    try:
        services.record_actuator_retry(operation_id, refusal, countdown)
    except Exception:
        log.warning("actuator.retry_message_failed", extra={"operation": operation_id}, exc_info=True)


def _give_up(task: task_pb2.Task, name: str, payload: str, operation_id: int | None,
             refusal: services.Refusal) -> None:
    """Dead-letter the task; the operation, its DeadLetter and its execution's state in one transaction
    (``workunits.services.dead_letter_operation``)."""
    log.error("actuator.dead_letter", extra={"task": name, "code": refusal.code, "error": refusal.message})
    type_name = task_pb2.Task.Type.Name(task.type)
    if operation_id is not None:
        services.dead_letter_operation(operation_id, refusal, task_name=name, task_type=type_name,
                                       payload=_raw(payload))
        return
    services.record_dead_letter(task_name=name, task_type=type_name, payload=_raw(payload), operation_id=None,
                                error_code=refusal.code, error_message=refusal.message, attempts=refusal.attempts)
