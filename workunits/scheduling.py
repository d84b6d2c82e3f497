"""Pause and resume of scheduling cluster-wide: the switch, its history, the gate.

Who calls it: ``manage.py pause_scheduling / resume_scheduling /
scheduling_status``, the admin actions on the switch, the staff-only REST
endpoints (``xmc.api.scheduling``) and, for :func:`hold_task`, the actuator's pause
handler (``k8s_bridge.actuator.pause``). Resumption itself lives in
``workunits.resumption``.

The switch is one row (``SchedulingSwitch`` id 1); every change appends a
``SchedulingSwitchChange`` in the same transaction.

The gate (why a pause waits for tasks in flight)
------------------------------------------------
Reading the switch in the same transaction as storing the PausedTask row is
not enough on its own: an actuator task that read "running" a moment before
the pause committed still goes on to touch the cluster *after* the commit. So
the switch has a gate, a Postgres advisory lock (:data:`GATE_LOCK_KEY`):

* the pause handler takes it *shared* (session level, no transaction held
  open) before it reads the switch, and keeps it while its task talks to the
  cluster; it is released when the task ends (:func:`leave_gate`);
* :func:`pause` takes it *exclusive* inside its transaction before it flips
  the switch, so it waits for every task already past the check, and new
  handlers queue behind it (Postgres grants lock requests in order) and read
  the committed switch once it is released.

Hence: once ``pause`` has returned, no Create, Restart or Update task reaches
the cluster until a resume; Delete tasks never pass the gate. A pause waits
at most ``XMC_PAUSE_DRAIN_TIMEOUT_S`` for tasks in flight and otherwise fails
with ABORTED, changing nothing.
"""
from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from core import convert, pb, task_wire
from core.errors import Aborted, InvalidArgument
from core.protos import task_pb2
from core.queues import Queue
from workunits import delivery, hooks, services, state
from workunits.choices import TaskType, WorkUnitState, Writer
from workunits.models import PausedTask, SchedulingSwitch, SchedulingSwitchChange

log = logging.getLogger(__name__)

#: The advisory lock of the gate (any constant unique in this database: "XMCPAUSE").
GATE_LOCK_KEY = 0x584D435041555345

#: Rows per resumption transaction unless the caller says otherwise.
DEFAULT_BATCH_SIZE = 500
MAX_BATCH_SIZE = 10_000
MAX_REASON_LENGTH = 1000

RESUMPTION_TASK = "xmc.resumption.run"

#: Task types the pause handler may hold (Delete always runs).
HELD_TYPES: dict[int, str] = {
    task_pb2.Task.CREATE: TaskType.CREATE,
    task_pb2.Task.RESTART: TaskType.RESTART,
    task_pb2.Task.UPDATE: TaskType.UPDATE,
}


@dataclass(frozen=True)
class SchedulingStatus:
    paused: bool
    #: When the switch last changed (while paused: paused since).
    since: datetime | None
    changed_by: str
    reason: str
    pending_paused_tasks: int


@dataclass(frozen=True)
class ResumeResult:
    run_id: uuid.UUID
    #: False when scheduling was not paused (the run still finishes leftover rows).
    was_paused: bool
    status: SchedulingStatus


# --- Reads ---------------------------------------------------------------------------


def pending_paused_tasks() -> int:
    return PausedTask.objects.filter(processed_time__isnull=True).count()


def get_status() -> SchedulingStatus:
    switch = SchedulingSwitch.objects.filter(id=1).first() or SchedulingSwitch(id=1)
    return _status(switch)


def _status(switch: SchedulingSwitch) -> SchedulingStatus:
    return SchedulingStatus(
        paused=switch.paused,
        since=switch.changed_time,
        changed_by=switch.changed_by,
        reason=switch.reason,
        pending_paused_tasks=pending_paused_tasks(),
    )


def is_paused() -> bool:
    return SchedulingSwitch.objects.filter(id=1, paused=True).exists()


def ensure_switch() -> None:
    """Create the switch row (running) if it does not exist yet; never changes it."""
    SchedulingSwitch.objects.bulk_create([SchedulingSwitch(id=1)], ignore_conflicts=True)


def _locked_switch() -> SchedulingSwitch:
    """The switch row, created if missing, locked FOR UPDATE (caller holds the transaction)."""
    ensure_switch()
    return SchedulingSwitch.objects.select_for_update().get(id=1)


# --- Pause and resume --------------------------------------------------------------------


def pause(*, reason: str, by: str, now: datetime | None = None) -> SchedulingStatus:
    """Pause scheduling cluster-wide; idempotent (pausing a paused switch changes nothing).

    Waits (at most ``XMC_PAUSE_DRAIN_TIMEOUT_S``) for the actuator tasks that
    already passed the gate; raises ABORTED when they do not finish in time.
    """
    reason = (reason or "").strip()
    if not reason:
        raise InvalidArgument("reason is required: say why scheduling is paused", field="reason")
    if len(reason) > MAX_REASON_LENGTH:
        raise InvalidArgument(f"reason is longer than {MAX_REASON_LENGTH} characters", field="reason")
    if not by:
        raise InvalidArgument("the operator pausing scheduling must be named", field="by")
    timeout_ms = max(1, int(settings.XMC_PAUSE_DRAIN_TIMEOUT_S * 1000))
    try:
        with transaction.atomic(durable=True):
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{timeout_ms}ms"])
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [GATE_LOCK_KEY])
                cursor.execute("SELECT set_config('lock_timeout', '0', true)")
            switch = _locked_switch()
            if switch.paused:
                return _status(switch)
            now = now or timezone.now()
            _change(switch, paused=True, by=by, reason=reason, now=now)
            log.info("scheduling.paused", extra={"by": by, "reason": reason})
            return _status(switch)
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # lock_not_available
            raise Aborted(
                f"actuator tasks still in flight after {settings.XMC_PAUSE_DRAIN_TIMEOUT_S} s; "
                "scheduling was not paused, try again"
            ) from None
        raise


def resume(
    *, by: str, batch_size: int = DEFAULT_BATCH_SIZE, dispatch: bool = True, now: datetime | None = None
) -> ResumeResult:
    """Clear the switch and start a resumption run with a new id.

    ``dispatch=True`` sends the run to the ``resumption`` queue after commit
    (admin, REST); the command passes ``False`` and runs it inline with a
    progress bar. A resume while not paused still starts a run, which
    finishes any rows a crashed run left behind.
    """
    batch_size = validate_batch_size(batch_size)
    if not by:
        raise InvalidArgument("the operator resuming scheduling must be named", field="by")
    run_id = uuid.uuid4()
    with transaction.atomic(durable=True):
        switch = _locked_switch()
        was_paused = switch.paused
        if was_paused:
            _change(switch, paused=False, by=by, reason="", now=now or timezone.now(), run_id=run_id)
        if dispatch:
            _dispatch_run(run_id, batch_size)  # an outbox row in this transaction, sent after commit
        log.info("scheduling.resumed", extra={"by": by, "run_id": str(run_id), "was_paused": was_paused})
        return ResumeResult(run_id=run_id, was_paused=was_paused, status=_status(switch))


def validate_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidArgument("batch_size must be an integer", field="batch_size")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidArgument(f"batch_size must be between 1 and {MAX_BATCH_SIZE}", field="batch_size")
    return batch_size


def _change(switch: SchedulingSwitch, *, paused: bool, by: str, reason: str, now: datetime,
            run_id: uuid.UUID | None = None) -> None:
    switch.paused = paused
    switch.reason = reason
    switch.changed_by = by
    switch.changed_time = now
    switch.save(update_fields=["paused", "reason", "changed_by", "changed_time"])
    change = SchedulingSwitchChange.objects.create(time=now, paused=paused, changed_by=by, reason=reason,
                                                   resumption_run_id=run_id)
    # Listeners above (notifications) hear of the change once it is committed.
    transaction.on_commit(lambda: hooks.on_scheduling_changed(change.id, paused, by, reason))


def _dispatch_run(run_id: uuid.UUID, batch_size: int) -> None:
    """Record the run as an outbox message (``workunits.delivery``): sent after commit, re-sent by
    the sweep if the broker lost it, claimed by the worker that runs it."""
    delivery.enqueue(Queue.RESUMPTION.value, RESUMPTION_TASK, [str(run_id), batch_size])


# --- The gate -------------------------------------------------------------------------------

_gate = threading.local()


def enter_gate() -> None:
    """Take the gate shared (session level) on this thread's connection.

    Waits while a pause is flipping the switch. Re-entrant per thread: only
    the first call takes the lock, :func:`leave_gate` releases it.
    """
    if getattr(_gate, "held", False):
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock_shared(%s)", [GATE_LOCK_KEY])
    _gate.held = True


def leave_gate() -> None:
    """Release the gate if this thread holds it (safe to call any time)."""
    if not getattr(_gate, "held", False):
        return
    _gate.held = False
    if connection.connection is None:
        return  # the connection was closed, and its session locks with it
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock_shared(%s)", [GATE_LOCK_KEY])


def holds_gate() -> bool:
    return bool(getattr(_gate, "held", False))


# --- The pause handler's write ------------------------------------------------------------


def _canonical(task: task_pb2.Task) -> bytes:
    """The task without its signature envelope: equal for a redelivered copy."""
    unsigned = task_pb2.Task()
    unsigned.CopyFrom(task)
    for name in ("expire_time_ns", "key_id", "signature"):
        unsigned.ClearField(name)
    return unsigned.SerializeToString(deterministic=True)


def _same_task(payload: bytes, canonical: bytes) -> bool:
    try:
        return _canonical(task_wire.decode(payload)) == canonical
    except task_wire.InvalidTask:
        return False  # an unreadable row is never "the same task"; resumption skips it


def paused_message(reason: str) -> dict[str, object]:
    text = "Scheduling is paused cluster-wide"
    text += f" ({reason})" if reason else ""
    text += "; this work unit will be scheduled when scheduling resumes."
    return convert.to_json(pb.structured_message.StructuredMessage(
        severity=pb.structured_message.StructuredMessage.Severity.INFO,
        source=pb.structured_message.StructuredMessage.Source.XMANAGER_BACKEND,
        user_facing_text=text,
    ))


def hold_task(task: task_pb2.Task, *, now: datetime | None = None) -> bool:
    """While paused, store ``task`` as a PausedTask and return True; else False.

    In one transaction: the switch is read ``FOR SHARE`` (a pause committing
    meanwhile waits, and this read sees any pause committed before it), the
    row is stored, and for Create/Restart the execution moves to
    SCHEDULING_PAUSED with an INFO message (masked ``status.state`` +
    ``status.system_message``, writer PAUSE_HANDLER; the guards drop it when
    the execution is no longer INITIALIZING/RESTARTING, e.g. already
    stopping). A redelivered copy of a held task is not stored twice.

    Not ``durable``: the actuator may call it inside a transaction of its own.
    """
    task_type = HELD_TYPES.get(task.type)
    if task_type is None:
        raise ValueError(f"only Create, Restart and Update tasks are held, not {task_pb2.Task.Type.Name(task.type)}")
    now = now or timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT paused, reason FROM {SchedulingSwitch._meta.db_table} WHERE id = 1 FOR SHARE"
            )
            row = cursor.fetchone()
        if row is None or not row[0]:
            return False
        reason = row[1]
        canonical = _canonical(task)
        siblings = PausedTask.objects.filter(
            processed_time__isnull=True, task_type=task_type, xid=task.xid, wid=task.wid, eid=task.eid
        ).values_list("payload", flat=True)
        if any(_same_task(bytes(p), canonical) for p in siblings):
            log.info("pause_handler.duplicate", extra={"xid": task.xid, "wid": task.wid, "eid": task.eid})
            return True
        held = PausedTask.objects.create(
            task_type=task_type, payload=task.SerializeToString(deterministic=True),
            xid=task.xid, wid=task.wid, eid=task.eid, created_time=now,
        )
        if task_type in (TaskType.CREATE, TaskType.RESTART):
            services.update_work_unit_executions_in_transaction([
                state.ExecutionUpdate(
                    xid=task.xid, wid=task.wid, eid=task.eid,
                    mask=(state.STATE, state.SYSTEM_MESSAGE),
                    state=WorkUnitState.SCHEDULING_PAUSED,
                    state_update_time_ns=convert.ns_from_datetime(now),
                    system_message=paused_message(reason),
                    writer=Writer.PAUSE_HANDLER,
                    extra={"paused_task": held.id, "operation": task.operation_name},
                )
            ], now=now)
        log.info("pause_handler.held", extra={"paused_task": held.id, "type": task_type,
                                              "xid": task.xid, "wid": task.wid, "eid": task.eid})
        return True

