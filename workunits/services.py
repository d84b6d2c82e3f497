"""Every write of work units, executions, operations, history and messages.

Called by the API (gRPC and REST), the admin, Celery tasks and the
reconciler; none of them save these models themselves. Each public function
opens one durable transaction. Locks are always taken in one order so two
transactions can never deadlock:

1. ``WorkUnit`` rows, ordered by ``(xid, wid)`` (a work unit's row lock
   guards its executions: every writer of an execution holds it);
2. then ``Experiment`` rows, ordered by ``xid`` (the roll-up).

Locks are ``SELECT ... FOR NO KEY UPDATE`` (``select_for_update(no_key=True)``):
they exclude each other but not the ``FOR KEY SHARE`` locks Postgres takes
on a referenced row when a child row (operation, history, message) is
inserted, so those inserts can never turn two writers into a deadlock.

``create_work_unit`` locks only its experiment (to allocate the wid) and
inserts, so it takes no work unit lock and fits the same order.

Work for other processes is recorded on Operation rows and handed over by
``workunits.outbox.send_on_commit`` after commit.
"""
from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import Field, Q
from django.utils import timezone

from experiments import services as experiment_services
from experiments.models import Experiment
from lifecycle.hooks import on_execution_superseded
from workunits import outbox, state
from workunits.choices import (
    TERMINAL,
    ActionType,
    ExecutionState,
    TaskType,
    WorkUnitState,
    WorkUnitType,
    Writer,
)
from workunits.models import Operation, StatusHistory, StatusMessage, WorkUnit, WorkUnitExecution
from workunits.state import ExecutionRecord, ExecutionUpdate, Merge
from workunits.validation import validate_executable
from xmc import convert, pb
from xmc.errors import FailedPrecondition, InvalidArgument, NotFound

log = logging.getLogger(__name__)
S = WorkUnitState


@dataclass(frozen=True)
class Transition:
    """A committed state change, returned for publishing after commit."""

    xid: int
    wid: int
    eid: int
    old_state: str
    new_state: str


@dataclass(frozen=True)
class Requester:
    """Who asked: the verified identity and, for audit only, the asserted email."""

    email: str = ""
    asserted_email: str = ""


SYSTEM = Requester(email="system")


def _now_ns(now: datetime) -> int:
    return convert.ns_from_datetime(now)


# --- Reads ---------------------------------------------------------------------------


def get_work_unit(xid: int, wid: int) -> WorkUnit:
    try:
        return WorkUnit.objects.select_related("experiment").get(experiment_id=xid, wid=wid)
    except WorkUnit.DoesNotExist:
        raise NotFound(f"experiments/{xid}/workUnits/{wid} not found", field="name") from None


def current_execution(wu: WorkUnit) -> WorkUnitExecution:
    return WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid)


# --- Create --------------------------------------------------------------------------


def create_work_unit(
    xid: int,
    message: pb.work_unit.WorkUnit,
    *,
    work_unit_id: int = 0,
    requester: Requester = SYSTEM,
    now: datetime | None = None,
) -> Operation:
    """CreateWorkUnit: a work unit, its execution eid=1 (INITIALIZING) and a CREATE operation.

    Idempotent on ``(xid, work_unit_id)``: the same id again returns the
    first call's operation and writes nothing. ``work_unit_id == 0`` allocates
    the next wid. Accepted in any launch state (the client marks the launch
    finished before its work units arrive).
    """
    if work_unit_id < 0:
        raise InvalidArgument("work_unit_id must not be negative", field="work_unit_id")
    validate_executable(message.executable)
    now = now or timezone.now()
    wu_type = (
        convert.enum_name(pb.work_unit.WorkUnit.WorkUnitType, message.work_unit_type, field="work_unit.work_unit_type")
        if message.work_unit_type else WorkUnitType.STANDARD
    )
    priority = (
        convert.enum_name(pb.priority.Priority, message.priority, field="work_unit.priority")
        if message.priority else None
    )
    urls = [convert.to_json(u) for u in message.urls]
    executable = convert.to_json(message.executable)

    with transaction.atomic(durable=True):
        # The experiment lock serializes creates of one experiment: a second
        # create of the same wid waits here and then finds the first one.
        exp, existing_id = _lock_for_create(xid, work_unit_id)
        if existing_id is not None:
            return Operation.objects.select_related("work_unit").get(id=existing_id)
        wid = work_unit_id or exp.last_wid + 1
        wu = WorkUnit(
            experiment=exp,
            wid=wid,
            work_unit_type=wu_type,
            priority=priority or exp.priority,
            create_time=now,
            update_time=now,
            urls=urls,
            executable=executable,
            tags=list(message.tags),
            notes=message.notes,
            current_eid=1,
        )
        op = Operation(
            experiment=exp,
            action_type=ActionType.CREATE,
            target=wu.name,
            create_time=now,
            original_requester=requester.email,
            asserted_email=requester.asserted_email,
            task_type=TaskType.CREATE,
            eid=1,
        )
        exp.last_wid = max(exp.last_wid, wid)
        rollup_fields = experiment_services.fold_rollup(
            exp, state_moves=[(None, S.INITIALIZING)], severity_moves=(), now=now, extra_fields=("last_wid",)
        )
        if not _insert_created(exp, rollup_fields, wu, op, now):
            # The wid exists although the lock read saw no CREATE operation for it:
            # created by a transaction that committed while this one waited for
            # the lock (the lock read's snapshot predates it), or damaged.
            replay = (
                Operation.objects.filter(experiment_id=xid, work_unit__wid=wid, action_type=ActionType.CREATE)
                .select_related("work_unit").order_by("id").first()
            )
            if replay is None:
                raise FailedPrecondition(f"{wu.name} exists already but has no create operation",
                                         field="work_unit_id")
            return replay
        outbox.send_on_commit([op.id])
        log.info("workunit.created", extra={"xid": xid, "wid": wid, "operation": op.id})
        return op


#: What the roll-up and the create read from the locked experiment, in model order (as ``from_db`` takes them).
_CREATE_LOCK_FIELDS = tuple(
    f.attname for f in Experiment._meta.concrete_fields
    if f.attname in {"id", "priority", "launch_state", "active_state", "child_state_counts",
                     "message_severity_counts", "complete_time", "last_child_status_update_time",
                     "status_update_time", "last_wid"}
)


#: Statements built once per process from the models (see `_lock_for_create`, `_create_sql`).
_SQL: dict[Any, Any] = {}


def _lock_for_create(xid: int, work_unit_id: int) -> tuple[Experiment, int | None]:
    """Lock experiment ``xid`` and read what a create needs, in one statement.

    Returns the experiment (only `_CREATE_LOCK_FIELDS` loaded) and the id of
    the CREATE operation of work unit ``work_unit_id`` if it exists already.
    """
    sql = _SQL.get("lock")
    if sql is None:
        qn = connection.ops.quote_name
        fields: list[Any] = [Experiment._meta.get_field(name) for name in _CREATE_LOCK_FIELDS]
        sql = _SQL["lock"] = (
            f"SELECT {', '.join('e.' + qn(f.column) for f in fields)}, "
            f"(SELECT o.id FROM {qn(Operation._meta.db_table)} o JOIN {qn(WorkUnit._meta.db_table)} w "
            f"ON o.work_unit_id = w.id WHERE w.experiment_id = e.id AND w.wid = %s "
            f"AND o.action_type = '{ActionType.CREATE.value}' ORDER BY o.id LIMIT 1) "
            f"FROM {qn(Experiment._meta.db_table)} e WHERE e.id = %s FOR NO KEY UPDATE OF e"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, [work_unit_id, xid])
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"experiments/{xid} not found", field="parent")
    values = [
        json.loads(value) if isinstance(value, str) and name in ("child_state_counts", "message_severity_counts")
        else value
        for name, value in zip(_CREATE_LOCK_FIELDS, row)
    ]
    exp = Experiment.from_db(connection.alias, list(_CREATE_LOCK_FIELDS), values)
    return exp, (row[-1] if work_unit_id else None)


def _insert_sql(alias: str, model: Any, refs: dict[str, str], source: str) -> tuple[str, list[Any]]:
    """One ``alias AS (INSERT ...)`` part of the create statement and the fields whose values it takes.

    Values are typed placeholders (``CAST(%s AS type)``, adapted as the ORM
    adapts them, model defaults included); ``refs`` replaces a column's value
    with an SQL expression (the id another part of the statement returned).
    """
    qn = connection.ops.quote_name
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    values = [refs.get(f.column) or f"CAST(%s AS {f.db_type(connection)})" for f in fields]
    columns = ", ".join(qn(f.column) for f in fields)
    table = qn(model._meta.db_table)
    if source:
        sql = f"{alias} AS (INSERT INTO {table} ({columns}) SELECT {', '.join(values)}{source} RETURNING id)"
    else:
        sql = (f"{alias} AS (INSERT INTO {table} ({columns}) VALUES ({', '.join(values)}) "
               f"ON CONFLICT (experiment_id, wid) DO NOTHING RETURNING id)")
    return sql, [f for f in fields if f.column not in refs]


def _create_sql(rollup_fields: tuple[str, ...]) -> tuple[str, list[tuple[str, list[Any]]]]:
    """The create statement (cached per roll-up field list) and, per row, the fields it binds."""
    cached = _SQL.get(rollup_fields)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    qn = connection.ops.quote_name
    parts = [
        ("w", WorkUnit, {}, ""),
        ("o", Operation, {"work_unit_id": "w.id"}, " FROM w"),
        ("x", WorkUnitExecution, {"work_unit_id": "w.id"}, " FROM w"),
        ("h", StatusHistory, {"execution_id": "x.id", "operation_id": "o.id"}, " FROM x, o"),
    ]
    ctes, binds = [], []
    for alias, model, refs, source in parts:
        sql, fields = _insert_sql(alias, model, refs, source)
        ctes.append(sql)
        binds.append((alias, fields))
    exp_fields: list[Any] = [Experiment._meta.get_field(name) for name in rollup_fields]
    assignments = ", ".join(f"{qn(f.column)} = CAST(%s AS {f.db_type(connection)})" for f in exp_fields)
    ctes.append(f"e AS (UPDATE {qn(Experiment._meta.db_table)} SET {assignments} "
                f"WHERE id = %s AND EXISTS (SELECT 1 FROM w) RETURNING id)")
    binds.append(("e", exp_fields))
    result = (f"WITH {', '.join(ctes)} SELECT w.id, o.id FROM w, o, x, h, e", binds)
    _SQL[rollup_fields] = result
    return result


def _insert_created(exp: Experiment, rollup_fields: Sequence[str], wu: WorkUnit, op: Operation,
                    now: datetime) -> bool:
    """Insert a work unit, its CREATE operation, execution 1 and its first history row, and write the
    experiment's roll-up, all in one statement; False (and nothing written) if the wid exists.

    One ``WITH ... INSERT`` chain: the work unit's insert is ``ON CONFLICT DO
    NOTHING`` on ``(xid, wid)`` and every other part reads its id, so a taken
    wid writes nothing at all. Sets the ids on ``wu`` and ``op`` as
    ``objects.create`` would.
    """
    ex = WorkUnitExecution(
        eid=1,
        execution_state=ExecutionState.ACTIVE,
        create_time=now,
        update_time=now,
        state=S.INITIALIZING,
        state_update_time_ns=_now_ns(now),
        metadata=_execution_metadata(wu),
    )
    history = StatusHistory(time=now, from_state="", to_state=S.INITIALIZING, writer=Writer.STATE_SERVER,
                            extra={"insert": True})
    sql, binds = _create_sql(tuple(rollup_fields))
    rows = {"w": wu, "o": op, "x": ex, "h": history, "e": exp}
    params: list[Any] = []
    for alias, fields in binds:
        obj = rows[alias]
        params += [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in fields]
    params.append(exp.id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    wu.id, op.id = row
    wu._state.adding = op._state.adding = False
    wu._state.db = op._state.db = connection.alias
    op.work_unit = wu
    return True


def _execution_metadata(wu: WorkUnit) -> dict[str, Any]:
    return convert.to_json(
        pb.work_unit_execution.WorkUnitExecutionMetadata(
            type=pb.work_unit_execution.WorkUnitExecutionMetadata.WorkUnitExecutionType.JOB_SET,
            resource_name=f"xmc-{wu.experiment_id}-{wu.wid}",
        )
    )


def _insert_execution(wu: WorkUnit, eid: int, initial: str, now: datetime, op: Operation) -> WorkUnitExecution:
    ex = WorkUnitExecution.objects.create(
        work_unit=wu,
        eid=eid,
        execution_state=ExecutionState.ACTIVE,
        create_time=now,
        update_time=now,
        state=initial,
        state_update_time_ns=_now_ns(now),
        metadata=_execution_metadata(wu),
    )
    StatusHistory.objects.create(
        execution=ex, time=now, from_state="", to_state=initial, writer=Writer.STATE_SERVER, operation=op,
        extra={"insert": True},
    )
    return ex


# --- Masked execution updates (the guarded write path) -------------------------------


def update_work_unit_executions(
    updates: Sequence[ExecutionUpdate], *, now: datetime | None = None
) -> list[Transition]:
    """Apply a batch of masked execution updates in one durable transaction.

    Everything is validated first: one malformed update (unknown path,
    unknown state, missing state_update_time) fails the whole batch with
    INVALID_ARGUMENT and nothing is written. Updates for a work unit that
    does not exist, or for an execution that is not current (EID fence), are
    skipped silently. Returns the committed state transitions; the caller
    publishes lifecycle events for them after commit.
    """
    state.validate_updates(updates)
    if not updates:
        return []
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        return _apply_updates(updates, now)


def _lock_work_units(keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], WorkUnit]:
    """Lock the work units for ``keys`` in (xid, wid) order (none for no keys)."""
    by_xid: dict[int, list[int]] = defaultdict(list)
    for xid, wid in sorted(set(keys)):
        by_xid[xid].append(wid)
    condition = Q()
    for xid, wids in by_xid.items():
        condition |= Q(experiment_id=xid, wid__in=wids)
    if not by_xid:
        return {}  # an empty Q() would match (and lock) every work unit
    rows = WorkUnit.objects.select_for_update(no_key=True).filter(condition).order_by("experiment_id", "wid")
    return {(wu.experiment_id, wu.wid): wu for wu in rows}


def _record_fields(record: ExecutionRecord, ex: WorkUnitExecution, now: datetime) -> None:
    ex.state = record.state
    ex.state_update_time_ns = record.state_update_time_ns
    ex.system_message = dict(record.system_message) if record.system_message else None
    ex.user_message = dict(record.user_message) if record.user_message else None
    ex.scheduling_information = dict(record.scheduling_information) if record.scheduling_information else None
    ex.detailed_status = dict(record.detailed_status) if record.detailed_status else None
    metadata = dict(ex.metadata or {})
    if record.mlrun_url:
        metadata["mlrunUrl"] = record.mlrun_url
    else:
        metadata.pop("mlrunUrl", None)
    ex.metadata = metadata
    ex.complete_time = convert.datetime_from_ns(record.complete_time_ns) if record.complete_time_ns else None
    ex.update_time = now


_EXECUTION_UPDATE_FIELDS = [
    "state", "state_update_time_ns", "system_message", "user_message", "scheduling_information",
    "detailed_status", "metadata", "complete_time", "update_time",
]


def _save_executions(rows: Sequence[WorkUnitExecution]) -> None:
    """Write the status fields of many executions in one pipelined statement.

    ``bulk_update`` builds a CASE expression per field and row, which costs
    ~5 ms of Python per row at the reconciler's batch sizes; an
    ``executemany`` of one parameterized UPDATE (values prepared by each
    field, so JSON and timestamps are adapted exactly as ``save()`` would)
    lets psycopg pipeline the batch.
    """
    meta = WorkUnitExecution._meta
    fields = [cast("Field[Any, Any]", meta.get_field(name)) for name in _EXECUTION_UPDATE_FIELDS]
    quote = connection.ops.quote_name
    sql = "UPDATE {} SET {} WHERE {} = %s".format(
        quote(meta.db_table),
        ", ".join(f"{quote(f.column)} = %s" for f in fields),
        quote("id"),
    )
    params = [
        [f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields] + [row.pk] for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _stamp(message: state.Message, now: datetime) -> dict[str, Any]:
    stamped = dict(message)
    stamped.setdefault("createTime", convert.timestamp(now).ToJsonString())  # type: ignore[union-attr]
    return stamped


def _apply_updates(updates: Sequence[ExecutionUpdate], now: datetime) -> list[Transition]:
    """The body of ``update_work_unit_executions``; caller holds the transaction."""
    now_ns = _now_ns(now)
    work_units = _lock_work_units(u.key for u in updates)
    executions = {
        ex.work_unit_id: ex
        for ex in WorkUnitExecution.objects.filter(
            work_unit_id__in=[wu.id for wu in work_units.values()], execution_state=ExecutionState.ACTIVE
        )
    }
    first: dict[int, ExecutionRecord] = {}
    records: dict[int, ExecutionRecord] = {}
    history: list[StatusHistory] = []
    messages: list[StatusMessage] = []
    transitions: list[Transition] = []

    for update in updates:
        wu = work_units.get(update.key)
        if wu is None:
            continue  # the work unit does not exist (deleted experiment): nothing to guard
        if state.is_fenced(update.eid, wu.current_eid):
            continue  # EID fence: an older (or unknown) execution; skipped silently
        ex = executions[wu.id]
        current = records.get(wu.id) or convert.execution_record(ex)
        first.setdefault(wu.id, current)
        merge: Merge = state.merge_execution(current, update, now_ns)
        if not merge.changed:
            continue
        record = merge.record
        stamped = []
        for kind, message in merge.new_messages:
            content = _stamp(message, now)
            stamped.append((kind, content))
            if kind == "system" and record.system_message == message:
                record = replace(record, system_message=content)
            elif kind == "user" and record.user_message == message:
                record = replace(record, user_message=content)
        records[wu.id] = record
        history.append(
            StatusHistory(
                execution=ex,
                time=now,
                from_state=merge.old_state,
                to_state=merge.new_state,
                writer=update.writer,
                operation_id=update.operation_id,
                request_id=update.request_id,
                extra={"mask": list(update.mask), **dict(update.extra)},
            )
        )
        for kind, content in stamped:
            messages.append(
                StatusMessage(
                    experiment_id=wu.experiment_id,
                    work_unit=wu,
                    execution_id=ex.eid,
                    content=content,
                    severity=content.get("severity", "SEVERITY_UNSPECIFIED"),
                    source=content.get("source", "SOURCE_UNSPECIFIED"),
                    kind=kind,
                    create_time=now,
                )
            )
        if merge.state_changed:
            transitions.append(Transition(wu.experiment_id, wu.wid, ex.eid, merge.old_state, merge.new_state))

    if not records:
        return []
    changed = []
    for wu_id, record in records.items():
        ex = executions[wu_id]
        _record_fields(record, ex, now)
        changed.append(ex)
    _save_executions(changed)
    StatusHistory.objects.bulk_create(history)
    StatusMessage.objects.bulk_create(messages)

    # Roll-up: one pass per experiment, experiments locked after work units.
    state_moves: dict[int, list[tuple[str | None, str | None]]] = defaultdict(list)
    severity_moves: dict[int, list[tuple[str | None, str | None]]] = defaultdict(list)
    xid_of = {wu.id: wu.experiment_id for wu in work_units.values()}
    for wu_id, record in records.items():
        before = first[wu_id]
        xid = xid_of[wu_id]
        state_moves[xid].append((before.state, record.state))
        severity_moves[xid].append((state.best_severity(before), state.best_severity(record)))
    for xid, exp in experiment_services.lock_experiments(state_moves).items():
        experiment_services.apply_rollup(exp, state_moves=state_moves[xid], severity_moves=severity_moves[xid], now=now)
    return transitions


# --- Stop ------------------------------------------------------------------------------


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


def _batch_operation(exp: Experiment, action: str, requester: Requester, now: datetime) -> Operation:
    """The one operation a batch RPC returns; per-work-unit operations are its children."""
    return Operation.objects.create(
        experiment=exp, action_type=action, target=exp.name, create_time=now,
        original_requester=requester.email, asserted_email=requester.asserted_email,
    )


def stop_work_units(
    xid: int,
    wids: Sequence[int] | None,
    *,
    batch: bool,
    requester: Requester = SYSTEM,
    now: datetime | None = None,
) -> Operation:
    """StopWorkUnit / BatchStopWorkUnits.

    Each targeted execution goes to STOPPING (STOPPED directly from
    SCHEDULING_PAUSED: no JobSet exists) through the guarded update, and a
    DELETE task is recorded per work unit. A single stop of a work unit that
    is already stopping returns its pending stop operation; of a terminal one
    fails with FAILED_PRECONDITION. A batch validates every target first and
    skips the ones already stopping or terminal. ``wids=None`` means all.
    """
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        exp, locked, currents = _targets(xid, wids)
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
                xid=xid, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE,), state=target,
                state_update_time_ns=_now_ns(now), writer=Writer.STATE_SERVER, operation_id=op.id,
            ))
        _apply_updates(updates, now)
        if parent is not None and not ops:
            _finish(parent, now, response=_batch_response(exp, []))
        outbox.send_on_commit([op.id for op in ops])
        if parent is not None:
            return parent
        return ops[0]


# --- Restart ----------------------------------------------------------------------------


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
            wu.update_time = now
            wu.save(update_fields=["current_eid", "update_time"])
            state_moves.append((old.state, S.RESTARTING))
            severity_moves.append((state.best_severity(convert.execution_record(old)), None))
            superseded.append((xid, wu.wid, old_eid))
        experiment_services.apply_rollup(
            experiment_services.lock_experiments([xid])[xid],
            state_moves=state_moves, severity_moves=severity_moves, now=now,
        )
        for xid_, wid_, eid_ in superseded:
            transaction.on_commit(partial(on_execution_superseded, xid_, wid_, eid_))
        outbox.send_on_commit([op.id for op in ops])
        if parent is not None:
            if not ops:
                _finish(parent, now, response=_batch_response(exp, []))
            return parent
        return ops[0]


# --- Other writes -----------------------------------------------------------------------


def update_work_unit(
    xid: int, wid: int, message: pb.work_unit.WorkUnit, paths: Sequence[str], *, now: datetime | None = None
) -> WorkUnit:
    """UpdateWorkUnit: replace the masked fields (priority, urls, tags, notes)."""
    if not paths:
        raise InvalidArgument("update_mask must name at least one field", field="update_mask")
    fields = convert.work_unit_fields(message, paths)
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


def record_enqueue_failure(operation_id: int, error: str, *, now: datetime | None = None) -> list[Transition]:
    """The broker refused a task: say so on the execution (ERROR, no force).

    A masked ``status.system_message`` update, so an existing ERROR message
    is kept (it explains more than "could not enqueue").
    """
    op = Operation.objects.select_related("work_unit").get(id=operation_id)
    if op.work_unit is None or op.eid is None:
        return []
    message = convert.to_json(pb.structured_message.StructuredMessage(
        severity=pb.structured_message.StructuredMessage.Severity.ERROR,
        source=pb.structured_message.StructuredMessage.Source.XMANAGER_BACKEND,
        user_facing_text=f"Could not hand the {op.action_type.lower()} request to the actuator: {error}",
    ))
    return update_work_unit_executions([
        ExecutionUpdate(
            xid=op.experiment_id, wid=op.work_unit.wid, eid=op.eid, mask=(state.SYSTEM_MESSAGE,),
            system_message=message, writer=Writer.STATE_SERVER, operation_id=op.id,
        )
    ], now=now)


def _batch_response(exp: Experiment, work_units: Sequence[WorkUnit]) -> dict[str, Any]:
    """A batch operation's response: ListWorkUnitsResponse of the affected units."""
    response = pb.api.ListWorkUnitsResponse(work_units=[pb.work_unit.WorkUnit(name=wu.name) for wu in work_units])
    return convert.packed_json(response)


def _finish(op: Operation, now: datetime, *, response: dict[str, Any] | None = None,
            error: dict[str, Any] | None = None) -> None:
    op.done = True
    op.end_time = now
    op.response = response
    op.error = error
    op.save(update_fields=["done", "end_time", "response", "error"])


def request_operation_cancellation(operation_id: int, *, requester: Requester = SYSTEM) -> Operation:
    """CancelOperation: record the request; a done operation is left as it is.

    Work already handed to the actuator is not interrupted (stop the work
    unit for that); the flag is visible in the operation's metadata.
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
