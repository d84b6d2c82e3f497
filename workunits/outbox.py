"""The seam between committed operations and the worker processes.

Services call ``send_on_commit(operations)`` inside their transaction; the
rows are handed to ``deliver_committed`` only after the transaction
commits, so nothing uncommitted is ever sent. The Operation row is the outbox: an operation that
is not done and has no ``dispatched_time`` has not reached the broker, and
the periodic sweep (``delivery.tasks.sweep``, run by beat) re-sends
every row from ``due_operations``: one that never left (a request committed
while the broker was down), and one whose lease ran out with no live claim
(the message was lost with a Redis restart, or the worker holding it died).
The lease and claim rules, the publish and the sweep are the ``delivery``
app's (``delivery.leases``, ``delivery.broker``, ``delivery.sweep``), shared
with every other queue.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from core import convert, task_wire
from core.protos import task_pb2
from core.queues import Queue
from core.task_wire import ACTUATOR_TASK_NAMES, NOTIFY_WHEN_PATH, encode_task
from delivery import broker, leases
from workunits import hooks
from workunits.choices import TaskType
from workunits.models import Operation, SchedulingSwitch
from workunits.services import operations as operation_rows
from workunits.wire import work_unit_to_proto

log = logging.getLogger(__name__)


def deliver(operation_ids: Sequence[int]) -> None:
    """Hand committed operations (by id) to the actuator queue: the sweep's path.

    Reads the rows (fresh: one may have finished since the sweep chose it),
    then as ``deliver_committed``; each row sent gets a fresh ``dispatched_time``
    (its lease starts again).
    """
    rows = Operation.objects.filter(id__in=list(operation_ids)).select_related("work_unit").order_by("id")
    _deliver_rows(list(rows), notify_when=None, resend=True)


def deliver_committed(operations: Sequence[Operation], *, notify_when: str | None = None) -> None:
    """Hand committed operations to the actuator queue, one signed Task each: the request path.

    ``operations`` are the objects the committed transaction wrote (with
    ``work_unit`` set), used as they are, without reading them back. One
    that is done or carries no task is skipped. A pending Create/Restart
    whose cancellation was requested ends CANCELLED instead of being sent
    (a cancellation committed after these
    objects were written is caught by the actuator, which re-reads the
    operation before acting: ``k8s_bridge.actuator.runner``); every other one
    is built into a Task and published. Only once the broker took it is
    ``dispatched_time`` set. A publish that fails is counted on the row (the
    sweep tries again); at ``XMC_OUTBOX_FAILURES_BEFORE_MESSAGE`` failures the
    execution gets the enqueue-failure system message
    (``services.operations.record_enqueue_failure``). ``notify_when``, when given, is
    the Task's notify-when (see ``build_task``).
    """
    _deliver_rows(operations, notify_when=notify_when, resend=False)


def _deliver_rows(operations: Sequence[Operation], *, notify_when: str | None, resend: bool) -> None:
    sent: list[int] = []
    with broker.producer() as producer:  # one producer (and broker connection) for them all
        for op in operations:
            if op.done or not op.task_type:
                continue
            if op.requested_cancellation and operation_rows.cancel_pending_operation(op.id):
                continue
            try:
                publish(build_task(op, notify_when=notify_when), producer=producer)
            except Exception as exc:
                attempts = operation_rows.record_dispatch_failure(op.id)
                log.warning("outbox.publish_failed",
                            extra={"operation": op.id, "attempts": attempts, "error": str(exc)})
                if attempts == settings.XMC_OUTBOX_FAILURES_BEFORE_MESSAGE:
                    operation_rows.record_enqueue_failure(op.id, f"{type(exc).__name__}: {exc}")
                continue
            sent.append(op.id)
    if sent and resend:
        leases.mark_sent(Operation, sent)
    elif sent:  # one mark for them all
        operation_rows.mark_operations_dispatched(sent)


def build_task(op: Operation, *, notify_when: str | None = None) -> task_pb2.Task:
    """The unsigned Task an operation row stands for (``publish`` signs it).

    ``notify_when`` is computed from the work unit's artifacts (through
    ``workunits.hooks.notify_when_for``, the provider the lifecycle registers)
    unless the caller knows it: a work unit created in the committing
    transaction has no artifacts yet ("").
    """
    wu = op.work_unit
    if wu is None:
        raise ValueError(f"operation {op.id} has no work unit: nothing to send")
    task = task_pb2.Task(
        type=task_pb2.Task.Type.Value(op.task_type),
        xid=op.experiment_id,
        wid=wu.wid,
        eid=op.eid or 0,
        target_eid=op.target_eid or 0,
        operation_name=op.name,
        operation_time_ns=convert.ns_from_datetime(op.create_time),
        notify_when=hooks.notify_when_for(op.experiment_id, wu.wid) if notify_when is None else notify_when,
    )
    if op.task_type in (TaskType.CREATE, TaskType.RESTART):
        task.work_unit.Pack(work_unit_to_proto(wu))
    elif op.task_type == TaskType.UPDATE:
        task.update_mask.paths.append(NOTIFY_WHEN_PATH)
    return task


def publish(task: task_pb2.Task, *, producer: Any = None) -> None:
    """Sign ``task`` (fresh expiry) and hand it to the broker (through ``producer`` when given).

    Raises when the broker does not take it; callers that must not lose it
    rely on the Operation row (outbox) or the PausedTask row staying behind.
    """
    task_wire.sign(task)
    broker.publish(ACTUATOR_TASK_NAMES[task.type], [encode_task(task)], queue=Queue.ACTUATOR.value,
                   producer=producer, argsrepr=f"({task.operation_name!r},)")


def send_on_commit(operations: Sequence[Operation], *, notify_when: str | None = None) -> None:
    """Deliver ``operations`` (rows written in the current transaction) once it commits."""
    ops = list(operations)
    if ops:
        transaction.on_commit(lambda: deliver_safely(ops, notify_when=notify_when))


def deliver_safely(operations: Sequence[Operation], *, notify_when: str | None) -> None:
    """``deliver_committed`` that never raises, for code that runs after its own commit: what it
    could not deliver stays in the outbox, for the sweep."""
    try:
        deliver_committed(operations, notify_when=notify_when)
    except Exception:
        # The rows stay undispatched: the sweep re-sends them.
        log.exception("outbox.deliver_failed", extra={"operation_ids": [op.id for op in operations]})


def due_operations(now: datetime) -> QuerySet[Operation]:
    """Operations a sweep must (re-)send (``delivery.leases.due``): never sent, or sent
    longer than a lease ago with no live claim.

    While scheduling is paused, a re-send of a Create, Restart or Update is
    left out (the worker would only hold it again: it is a PausedTask that
    resumption sends); Deletes never wait.
    """
    rows = Operation.objects.filter(done=False).exclude(task_type="").filter(leases.due(now))
    if SchedulingSwitch.objects.filter(id=1, paused=True).exists():
        rows = rows.filter(Q(dispatched_time__isnull=True) | Q(task_type=TaskType.DELETE))
    return rows.order_by("create_time")


def undispatched_operations(created_before: datetime) -> QuerySet[Operation]:
    """Operations a sweep must re-send: not done, never accepted by the broker."""
    return Operation.objects.filter(
        done=False, dispatched_time__isnull=True, create_time__lt=created_before
    ).exclude(task_type="").order_by("create_time")


def sweep_operations(*, limit: int = 1000) -> int:
    """Re-send the due operations (registered with ``delivery.sweep``): at most ``limit``, oldest first."""
    ids = list(due_operations(timezone.now()).values_list("id", flat=True)[:limit])
    if ids:
        deliver(ids)
    return len(ids)
