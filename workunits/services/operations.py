"""Operation rows: dispatch bookkeeping, completion, cancellation, purge and dead letters.

The outbox (``workunits.outbox``) and the actuator write through these; they
import nothing above them (the outbox imports this module, not the other way).
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from core import convert, pb
from core.db import int_array
from core.errors import FailedPrecondition
from experiments.models import Experiment
from workunits import state
from workunits.choices import TaskType, Writer
from workunits.hooks import Transition
from workunits.models import DeadLetter, Operation
from workunits.services._rows import Requester, SYSTEM, _batch_response, _finish
from workunits.services.executions import update_work_unit_executions
from workunits.state import ExecutionUpdate
from workunits.wire import work_unit_to_proto


def record_enqueue_failure(operation_id: int, error: str, *, now: datetime | None = None) -> list[Transition]:
    """The broker kept refusing a task: say so on the execution (no force).

    STATES.md: a FATAL message when a Create or (batch) Restart could not be
    enqueued (nothing will ever start it unless the sweep gets through), an
    ERROR message on the Stop paths. A masked ``status.system_message``
    update, so the guard keeps a message of higher severity.
    """
    op = Operation.objects.select_related("work_unit").get(id=operation_id)
    if op.work_unit is None or op.eid is None:
        return []
    Severity = pb.structured_message.StructuredMessage.Severity
    severity = Severity.FATAL if op.task_type in (TaskType.CREATE, TaskType.RESTART) else Severity.ERROR
    message = convert.to_json(pb.structured_message.StructuredMessage(
        severity=severity,
        source=pb.structured_message.StructuredMessage.Source.XMANAGER_BACKEND,
        user_facing_text=f"Could not hand the {op.action_type.lower()} request to the actuator: {error}",
    ))
    return update_work_unit_executions([
        ExecutionUpdate(
            xid=op.experiment_id, wid=op.work_unit.wid, eid=op.eid, mask=(state.SYSTEM_MESSAGE,),
            system_message=message, writer=Writer.STATE_SERVER, operation_id=op.id,
        )
    ], now=now)


#: google.rpc.Code.CANCELLED (what a cancelled operation's error carries).
CANCELLED_CODE: int = pb.rpc_code.CANCELLED


def mark_operations_dispatched(operation_ids: Sequence[int], *, now: datetime | None = None) -> int:
    """The broker took these operations' tasks: they have left the outbox (first time only).

    One conditional UPDATE, its own transaction (autocommit), committed
    without waiting for the WAL flush: the hot path of every request.
    Returns how many were marked now.
    """
    now = now or timezone.now()
    with connection.cursor() as cursor:  # after the commit that wrote the operations: outside any transaction
        cursor.execute(_MARK_DISPATCHED_SQL, [now, int_array(operation_ids)])
        return int(cursor.rowcount)


#: ``set_config(..., true)`` is ``SET LOCAL`` inside the statement's own transaction: its
#: commit does not wait for the WAL flush. A mark lost in a crash only makes the sweep send
#: the task again, which the actuator treats as a redelivery. (Raw SQL: the ORM's UPDATE cost more.)
_MARK_DISPATCHED_SQL = (
    f"UPDATE {Operation._meta.db_table} SET dispatched_time = %s, dispatch_attempts = dispatch_attempts + 1 "
    "WHERE id = ANY(%s::bigint[]) AND dispatched_time IS NULL "
    "AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
)


def record_dispatch_failure(operation_id: int) -> int:
    """One more failed hand-over to the broker; returns the attempts so far."""
    with transaction.atomic(durable=True):
        Operation.objects.filter(id=operation_id).update(dispatch_attempts=F("dispatch_attempts") + 1)
        return int(Operation.objects.filter(id=operation_id).values_list("dispatch_attempts", flat=True).first() or 0)


def complete_operation(
    operation_id: int,
    *,
    response: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> bool:
    """Mark an operation done with its response or error, exactly once.

    Returns False (and writes nothing) when it was already done or is gone, so
    a redelivered task can never finish an operation twice: the write is one
    ``UPDATE ... WHERE done = false``, and only the caller whose update hit
    the row goes on. A work-unit operation's response defaults to its
    WorkUnit. When the last child of a batch operation is done, the parent is
    done too (in the same transaction): its response lists the children's
    work units, or it carries the first child's error.
    """
    now = now or timezone.now()
    op = Operation.objects.select_related("work_unit").filter(id=operation_id).first()
    if op is None or op.done:
        return False
    if op.parent_id is None:
        return complete_in_transaction(op, response=response, error=error, now=now)
    with transaction.atomic(durable=True):
        return complete_in_transaction(op, response=response, error=error, now=now)


def complete_in_transaction(
    op: Operation,
    *,
    response: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    now: datetime,
) -> bool:
    """``complete_operation`` for a caller that holds its transaction (or a lone row: one UPDATE).

    The dead letter (``workunits.services.failures``) finishes the operation,
    writes its DeadLetter and moves the execution in one transaction.
    """
    if error is None and response is None and op.work_unit is not None:
        response = convert.packed_json(work_unit_to_proto(op.work_unit))
    fields = {"done": True, "end_time": now, "response": None if error else response, "error": error}
    if not Operation.objects.filter(id=op.id, done=False).update(**fields):
        return False
    if op.parent_id is not None:
        _complete_parent(op.parent_id, now)
    return True


def _complete_parent(parent_id: int, now: datetime) -> None:
    parent = Operation.objects.select_for_update(no_key=True).get(id=parent_id)
    if parent.done:
        return
    children = list(Operation.objects.filter(parent_id=parent_id).select_related("work_unit").order_by("id"))
    if any(not child.done for child in children):
        return
    failed = next((child for child in children if child.error), None)
    if failed is not None:
        _finish(parent, now, error=failed.error)
    else:
        exp = Experiment.objects.get(id=parent.experiment_id)
        _finish(parent, now, response=_batch_response(exp, [c.work_unit for c in children if c.work_unit]))


def cancel_pending_operation(operation_id: int, *, now: datetime | None = None) -> bool:
    """CancelOperation made real: a Create/Restart whose task has not run ends CANCELLED.

    Called by the outbox before sending and by the actuator before it acts;
    True when the operation was cancelled here (the caller then skips it).
    """
    op = Operation.objects.filter(id=operation_id).values("requested_cancellation", "task_type", "done").first()
    if op is None or op["done"] or not op["requested_cancellation"]:
        return False
    if op["task_type"] not in (TaskType.CREATE, TaskType.RESTART):
        return False
    return complete_operation(
        operation_id, error={"code": CANCELLED_CODE, "message": "cancelled before the actuator ran it"}, now=now,
    )


def purge_done_operations(*, older_than: datetime) -> int:
    """Delete done operations whose ``end_time`` is before ``older_than`` (the 90-day clean-up).

    Batch parents go last: a child still referring to a parent keeps it (the
    parent's deletion would cascade to children that are not old enough).
    """
    with transaction.atomic(durable=True):
        old = Operation.objects.filter(done=True, end_time__lt=older_than)
        deleted, _ = old.filter(parent__isnull=False).delete()
        parents, _ = old.filter(parent__isnull=True).exclude(children__end_time__gte=older_than).exclude(
            children__done=False).delete()
        return int(deleted) + int(parents)


def record_dead_letter(
    *,
    task_name: str,
    task_type: str,
    payload: bytes,
    operation_id: int | None,
    error_code: str,
    error_message: str,
    attempts: int,
    source: str = "",
    source_id: int | None = None,
    now: datetime | None = None,
) -> DeadLetter:
    """Store a task that failed permanently or ran out of retries.

    ``source``/``source_id``: the row of an app above this one the task was about
    (``notifications.delivery``); its app writes the letter in the transaction that
    gives the row up, so this joins the caller's transaction when there is one.
    """
    now = now or timezone.now()
    with transaction.atomic():
        if operation_id is not None and not Operation.objects.filter(id=operation_id).exists():
            operation_id = None
        return DeadLetter.objects.create(
            task_name=task_name, task_type=task_type, payload=payload, operation_id=operation_id,
            error_code=error_code, error_message=error_message[:10_000], attempts=attempts, created_time=now,
            source=source, source_id=source_id,
        )


def mark_dead_letters_requeued(source: str, source_id: int, *, now: datetime | None = None) -> int:
    """The row a dead letter is about was sent again by its own app (a subscriber's "Send again"):
    its open letters say so."""
    return int(DeadLetter.objects.filter(source=source, source_id=source_id, requeued_time__isnull=True)
               .update(requeued_time=now or timezone.now()))


def request_operation_cancellation(operation_id: int, *, requester: Requester = SYSTEM) -> Operation:
    """CancelOperation: record the request; a done operation is left as it is.

    A pending Create or Restart whose task has not run yet is then skipped
    and ends CANCELLED (the outbox and the actuator check the flag, see
    ``cancel_pending_operation``); work the actuator already did is not undone
    (stop the work unit for that). The flag is visible in the metadata.
    """
    with transaction.atomic(durable=True):
        op = Operation.objects.select_for_update(no_key=True).get(id=operation_id)
        if not op.done and not op.requested_cancellation:
            op.requested_cancellation = True
            op.cancellation_requester = requester.email
            op.save(update_fields=["requested_cancellation", "cancellation_requester"])
        return op


def delete_operation(operation_id: int) -> None:
    """DeleteOperation: forget a finished operation (a pending one is still the outbox)."""
    with transaction.atomic(durable=True):
        op = Operation.objects.select_for_update(no_key=True).get(id=operation_id)
        if not op.done:
            raise FailedPrecondition(f"operation {operation_id} is not done yet", field="name")
        op.delete()
