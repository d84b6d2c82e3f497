"""Stop, restart and update of work units, and the admin's re-queue of a dead letter.

Each takes the work unit locks in ``(xid, wid)`` order, then the experiment's
(the roll-up), records an Operation and hands it to the outbox after commit.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial

from django.db import transaction
from django.utils import timezone

from core import convert, pb
from core.errors import FailedPrecondition, InvalidArgument, NotFound
from experiments import services as experiment_services
from experiments.models import Experiment
from workunits import delivery as messages
from workunits import hooks, outbox, state
from workunits.choices import ActionType, ExecutionState, TERMINAL, TaskType, WorkUnitState, Writer
from workunits.hooks import Transition, on_execution_superseded, on_transitions_committed
from workunits.models import DeadLetter, Operation, WorkUnit, WorkUnitExecution
from workunits.services._rows import (
    Requester,
    SYSTEM,
    _batch_operation,
    _batch_response,
    _finish,
    _insert_execution,
    _now_ns,
)
from workunits.services.executions import _apply_updates, _lock_work_units
from workunits.state import ExecutionUpdate
from workunits.wire import execution_record, work_unit_fields
S = WorkUnitState


def _target_work_units(xid: int, wids: Sequence[int] | None) -> dict[tuple[int, int], WorkUnit]:
    """Lock the targeted work units of ``xid`` (all when ``wids`` is None); all must exist."""
    if not Experiment.objects.filter(id=xid).exists():
        raise NotFound(f"experiments/{xid} not found", field="parent")
    if wids is None:
        wids = list(WorkUnit.objects.filter(experiment_id=xid).values_list("wid", flat=True))
    locked = _lock_work_units((xid, wid) for wid in wids)
    missing = sorted(set(wids) - {wid for _, wid in locked})
    if missing:
        raise NotFound(
            f"work units not found in experiments/{xid}: {', '.join(map(str, missing))}", field="name"
        )
    return locked


def _targets(
    xid: int, wids: Sequence[int] | None
) -> tuple[Experiment, dict[tuple[int, int], WorkUnit], dict[int, WorkUnitExecution]]:
    """Lock the targets of a stop/restart and read their current executions."""
    locked = _target_work_units(xid, wids)
    currents = {
        ex.work_unit_id: ex
        for ex in WorkUnitExecution.objects.filter(
            work_unit__in=locked.values(), execution_state=ExecutionState.ACTIVE
        )
    }
    return Experiment.objects.get(id=xid), locked, currents


def _info(text: str) -> dict[str, object]:
    return convert.to_json(pb.structured_message.StructuredMessage(
        severity=pb.structured_message.StructuredMessage.Severity.INFO,
        source=pb.structured_message.StructuredMessage.Source.XMANAGER_BACKEND, user_facing_text=text))


def stop_work_units(
    xid: int,
    wids: Sequence[int] | None,
    *,
    batch: bool,
    requester: Requester = SYSTEM,
    now: datetime | None = None,
    message: str = "",
) -> Operation:
    """StopWorkUnit / BatchStopWorkUnits.

    Each targeted execution goes to STOPPING (STOPPED directly from
    SCHEDULING_PAUSED: no JobSet exists) through the guarded update, and a
    DELETE task is recorded per work unit. A single stop of a work unit that
    is already stopping returns its pending stop operation; of a terminal one
    fails with FAILED_PRECONDITION. A batch validates every target first and
    skips the ones already stopping or terminal. ``wids=None`` means all.

    The clock is read *after* the row locks are held, and the state is
    stamped at least the stored ``state_update_time``: a writer that
    committed while we waited (the pause handler, or a host whose clock runs
    ahead) can never make the timestamp guard drop STOPPED while the STOP
    operation and its DELETE task still go out.

    ``message``, when given, is the stopped executions' system message (INFO), e.g. why a study
    stopped its trial ("pruned by study 3 at step 12: ...").
    """
    with transaction.atomic(durable=True):
        exp, locked, currents = _targets(xid, wids)
        now = now or timezone.now()  # under the locks: after every write we waited for
        if not batch:
            (wu,) = locked.values()
            ex = currents[wu.id]
            if ex.state == S.STOPPING:
                pending = Operation.objects.filter(
                    work_unit=wu, action_type=ActionType.STOP, done=False, eid=wu.current_eid
                ).order_by("-id").first()
                if pending is not None:
                    return pending
            if ex.state in TERMINAL:
                raise FailedPrecondition(f"{wu.name} is already {ex.state}", field="name")
        parent = _batch_operation(exp, ActionType.STOP, requester, now) if batch else None
        ops: list[Operation] = []
        updates: list[ExecutionUpdate] = []
        for key in sorted(locked):
            wu = locked[key]
            ex = currents[wu.id]
            if ex.state in TERMINAL or (batch and ex.state == S.STOPPING):
                continue
            op = Operation.objects.create(
                experiment=exp, work_unit=wu, parent=parent, action_type=ActionType.STOP, target=wu.name,
                create_time=now, original_requester=requester.email, asserted_email=requester.asserted_email,
                task_type=TaskType.DELETE, eid=wu.current_eid, target_eid=wu.current_eid,
            )
            ops.append(op)
            target = S.STOPPED if ex.state == S.SCHEDULING_PAUSED else S.STOPPING
            updates.append(ExecutionUpdate(
                xid=xid, wid=wu.wid, eid=wu.current_eid,
                mask=(state.STATE, state.SYSTEM_MESSAGE) if message else (state.STATE,), state=target,
                state_update_time_ns=max(_now_ns(now), ex.state_update_time_ns),
                system_message=_info(message) if message else None,
                writer=Writer.STATE_SERVER, operation_id=op.id,
            ))
        transitions = _apply_updates(updates, now)
        # The pages and notifications hear of STOPPING (STOPPED from a paused unit) as they hear
        # of the reconciler's changes: after commit, through the committed hooks.
        transaction.on_commit(partial(on_transitions_committed, transitions))
        if parent is not None and not ops:
            _finish(parent, now, response=_batch_response(exp, []))
        outbox.send_on_commit(ops)
        if parent is not None:
            return parent
        return ops[0]


def restart_work_units(
    xid: int,
    wids: Sequence[int] | None,
    *,
    batch: bool,
    requester: Requester = SYSTEM,
    now: datetime | None = None,
) -> Operation:
    """RestartWorkUnit / BatchRestartWorkUnits.

    For each target: archive execution N (INACTIVE), insert N+1 in
    RESTARTING as the current execution, record a RESTART task (target eid
    N), and after commit call the lifecycle superseded hook for N. All
    targets are validated first; one transaction, all or nothing.
    """
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        exp, locked, currents = _targets(xid, wids)
        parent = _batch_operation(exp, ActionType.RESTART, requester, now) if batch else None
        ops = _restart_locked(exp, locked, currents, parent=parent, requester=requester, now=now)
        if parent is not None:
            if not ops:
                _finish(parent, now, response=_batch_response(exp, []))
            return parent
        return ops[0]


def _restart_locked(
    exp: Experiment,
    locked: dict[tuple[int, int], WorkUnit],
    currents: dict[int, WorkUnitExecution],
    *,
    parent: Operation | None,
    requester: Requester,
    now: datetime,
) -> list[Operation]:
    """The body of a restart, for a caller holding the work unit locks (restart, re-queue of a dead letter)."""
    xid = exp.id
    ops: list[Operation] = []
    state_moves: list[tuple[str | None, str | None]] = []
    severity_moves: list[tuple[str | None, str | None]] = []
    superseded: list[tuple[int, int, int]] = []
    for key in sorted(locked):
        wu = locked[key]
        old = currents[wu.id]
        old_eid, new_eid = wu.current_eid, wu.current_eid + 1
        # Archive first: the partial unique constraint allows one ACTIVE row.
        WorkUnitExecution.objects.filter(pk=old.pk).update(
            execution_state=ExecutionState.INACTIVE, update_time=now
        )
        op = Operation.objects.create(
            experiment=exp, work_unit=wu, parent=parent, action_type=ActionType.RESTART, target=wu.name,
            create_time=now, original_requester=requester.email, asserted_email=requester.asserted_email,
            task_type=TaskType.RESTART, eid=new_eid, target_eid=old_eid,
        )
        ops.append(op)
        _insert_execution(wu, new_eid, S.RESTARTING, now, op)
        wu.current_eid = new_eid
        wu.current_state, wu.current_start, wu.current_end = S.RESTARTING, now, None
        wu.update_time = now
        wu.save(update_fields=["current_eid", "current_state", "current_start", "current_end", "update_time"])
        state_moves.append((old.state, S.RESTARTING))
        severity_moves.append((state.best_severity(execution_record(old)), None))
        superseded.append((xid, wu.wid, old_eid))
    experiment_services.apply_rollups({xid: (state_moves, severity_moves)}, now=now)
    transaction.on_commit(partial(on_transitions_committed, [
        Transition(x, w, e + 1, old_state or "", S.RESTARTING)
        for (x, w, e), (old_state, _) in zip(superseded, state_moves)]))
    for xid_, wid_, eid_ in superseded:
        transaction.on_commit(partial(on_execution_superseded, xid_, wid_, eid_))
    outbox.send_on_commit(ops)
    return ops


def record_notify_when_update(xid: int, wid: int, *, now: datetime | None = None) -> Operation | None:
    """Record, in the caller's transaction, an UPDATE of the running JobSet's notify-when.

    Called when an artifact a rule handles is attached (``lifecycle.stamping``).
    The Operation row is the outbox, as for a Stop: it is sent after commit,
    re-sent by the sweep until the actuator has patched the JobSet
    (``k8s_bridge.actuator.handlers.handle_update``), and its value is
    computed when it is sent (``workunits.outbox.build_task``), so it carries
    every artifact committed by then. None when the work unit is missing or its
    current execution has ended (no JobSet to patch).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record_notify_when_update runs inside the attaching transaction")
    row = (WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid,
                                            execution_state=ExecutionState.ACTIVE)
           .select_related("work_unit").first())
    if row is None or row.state in TERMINAL:
        return None
    wu = row.work_unit
    op = Operation.objects.create(
        experiment_id=xid, work_unit=wu, action_type=ActionType.UPDATE, target=wu.name,
        create_time=now or timezone.now(), task_type=TaskType.UPDATE, eid=row.eid,
    )
    outbox.send_on_commit([op])
    return op


def update_work_unit(
    xid: int, wid: int, message: pb.work_unit.WorkUnit, paths: Sequence[str], *, now: datetime | None = None
) -> WorkUnit:
    """UpdateWorkUnit: replace the masked fields (priority, urls, tags, notes)."""
    if not paths:
        raise InvalidArgument("update_mask must name at least one field", field="update_mask")
    fields = work_unit_fields(message, paths)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        locked = _lock_work_units([(xid, wid)])
        wu = locked.get((xid, wid))
        if wu is None:
            raise NotFound(f"experiments/{xid}/workUnits/{wid} not found", field="work_unit.name")
        for name, value in fields.items():
            setattr(wu, name, value)
        wu.update_time = now
        wu.save(update_fields=[*fields, "update_time"])
        return wu


def send_dead_letter_again(dead_letter_id: int, *, requester: Requester = SYSTEM,
                           now: datetime | None = None) -> object:
    """The admin's "send again" of any dead letter: what it was about is sent again by its owner.

    An operation: :func:`requeue_dead_letter` (STATES.md's rules); an outbox
    message (a lifecycle event, a resumption run): reopened and sent after
    commit; a row of an app above (``source``, e.g. a notification delivery):
    that app's handler (``workunits.hooks.dead_letter_requeuers``), in the same
    transaction as the letter's ``requeued_time``. Returns what was sent again;
    FAILED_PRECONDITION names why nothing could be.
    """
    now = now or timezone.now()
    dead = DeadLetter.objects.filter(id=dead_letter_id).first()
    if dead is None:
        raise NotFound(f"dead letter {dead_letter_id} not found", field="dead_letter")
    if dead.operation_id is not None:
        return requeue_dead_letter(dead_letter_id, requester=requester, now=now)
    with transaction.atomic(durable=True):
        dead = DeadLetter.objects.select_for_update().get(id=dead_letter_id)
        if dead.message_id is not None:
            sent: object = messages.requeue_message(dead.message_id)
        elif dead.source and dead.source_id is not None:
            try:
                sent = hooks.dead_letter_requeuers(dead.source, dead.source_id)
            except LookupError as exc:
                raise FailedPrecondition(f"dead letter {dead_letter_id}: {exc}", field="source") from exc
        else:
            raise FailedPrecondition(
                f"dead letter {dead_letter_id} has nothing to send again (an invalid task)", field="operation")
        dead.requeued_time = now
        dead.save(update_fields=["requeued_time"])
        return sent


def requeue_dead_letter(dead_letter_id: int, *, requester: Requester = SYSTEM,
                        now: datetime | None = None) -> Operation:
    """Send a dead-lettered task's operation again (the admin's re-queue action); returns what was sent.

    The task is rebuilt from rows, never replayed from the stored payload
    (which may be the tampered one). Which execution it brings back follows
    STATES.md (docs/architecture/jobset_and_work_unit_states.md, "Dead letters"):

    * a Create or Restart whose dead letter turned its execution N FAILED
      (``workunits.services.dead_letter_operation``): nothing leaves FAILED,
      and only an insert writes RESTARTING, so the re-queue is a restart: N
      is archived, N+1 inserted in RESTARTING, and a new RESTART operation
      (target eid N) is sent; the dead-lettered operation keeps its error as
      the record of what happened;
    * a Create or Restart whose work unit moved on since (a restart, a stop:
      its execution is no longer current, STOPPING or terminal otherwise) is
      refused with FAILED_PRECONDITION: a re-queue never overrides a person's
      later decision;
    * anything else (a Delete, an Update, a Create dead-lettered before its
      execution was failed) reopens the same operation
      (``done``/``error``/``dispatched_time`` cleared) and hands it to the
      outbox after commit.

    A dead letter without an operation cannot be re-queued.
    """
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        dead = DeadLetter.objects.select_for_update().get(id=dead_letter_id)
        if dead.operation_id is None:
            raise FailedPrecondition(
                f"dead letter {dead_letter_id} has no operation to send again (an invalid task)", field="operation"
            )
        op = Operation.objects.select_for_update(no_key=True, of=("self",)).select_related("work_unit").get(
            id=dead.operation_id)
        if op.task_type in (TaskType.CREATE, TaskType.RESTART) and op.work_unit is not None:
            exp, locked, currents = _targets(op.experiment_id, [op.work_unit.wid])
            (wu,) = locked.values()
            ex = currents[wu.id]
            if wu.current_eid == op.eid and ex.state == S.FAILED and op.done:
                (restart,) = _restart_locked(exp, locked, currents, parent=None, requester=requester, now=now)
                dead.requeued_time = now
                dead.save(update_fields=["requeued_time"])
                return restart
            if wu.current_eid != op.eid or ex.state in TERMINAL or ex.state == S.STOPPING:
                raise FailedPrecondition(
                    f"{wu.name} has moved on since this dead letter (execution {wu.current_eid} is {ex.state}):"
                    " nothing to re-queue", field="operation")
        op.done = False
        op.end_time = None
        op.error = None
        op.response = None
        op.dispatched_time = None
        op.claimed_until = None
        op.save(update_fields=["done", "end_time", "error", "response", "dispatched_time", "claimed_until"])
        if op.parent_id is not None:
            Operation.objects.filter(id=op.parent_id, done=True).update(done=False, end_time=None, error=None,
                                                                       response=None)
        dead.requeued_time = now
        dead.save(update_fields=["requeued_time"])
        outbox.send_on_commit([op])
        return op
