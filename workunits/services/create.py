"""CreateWorkUnit: validation, the group commit of concurrent creates, and the one-statement insert.

Concurrent creates in one experiment are batched (``workunits.group_commit``):
one transaction locks the experiment, allocates the wids, folds the roll-up
and inserts every work unit, execution, history row and operation with one
CTE statement; the operations are handed to the outbox after commit.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache, partial
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from core import convert, limits, pb
from core.db import int_array, kept_cursor
from core.errors import Aborted, FailedPrecondition, NotFound
from experiments import services as experiment_services
from experiments.models import Experiment
from jobsets.validation import validate_executable, validate_work_unit_request
from workunits import arguments, outbox
from workunits.choices import ActionType, ExecutionState, TaskType, WorkUnitState, WorkUnitType, Writer
from workunits.group_commit import GroupCommit
from workunits.models import Operation, StatusHistory, WorkUnit, WorkUnitExecution
from workunits.services import argument_stats
from workunits.services._rows import Requester, SYSTEM, _execution_metadata, _now_ns
from workunits.services.executions import _dumps, _loads
from workunits.wire import work_unit_to_proto

log = logging.getLogger("workunits.services")  # one logger for the package (its name predates the split)
S = WorkUnitState


#: At most this many creates of one experiment share a transaction (see `create_work_unit`).
CREATE_BATCH_MAX = 64


@dataclass(frozen=True)
class _Create:
    """One validated CreateWorkUnit, as the batch that carries it out needs it."""

    work_unit_id: int
    work_unit_type: str
    priority: str | None
    urls: list[Any]
    executable: dict[str, Any]
    tags: list[str]
    notes: str
    requester: Requester
    now: datetime


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
    first call's operation and writes nothing (or, when the client deleted
    that operation, a fresh done one for the existing work unit). ``work_unit_id == 0`` allocates
    the next wid. Accepted in any launch state (the client marks the launch
    finished before its work units arrive).

    Validated here, in the caller's thread; then written by group commit
    (`workunits.group_commit`): concurrent creates of one experiment in this
    process share one transaction, each with the result it would have had
    alone, in arrival order. The transaction is durable: a caller inside a
    transaction of its own is refused (RuntimeError), and never joins a batch
    of another thread. (A test's transaction, which Django does not hold
    durable, runs the create alone, in it.)
    """
    validate_work_unit_request(message, work_unit_id)
    validate_executable(message.executable)
    request = _Create(
        work_unit_id=work_unit_id,
        work_unit_type=(
            convert.enum_name(pb.work_unit.WorkUnit.WorkUnitType, message.work_unit_type,
                              field="work_unit.work_unit_type")
            if message.work_unit_type else WorkUnitType.STANDARD
        ),
        priority=(
            convert.enum_name(pb.priority.Priority, message.priority, field="work_unit.priority")
            if message.priority else None
        ),
        urls=[convert.to_json(u) for u in message.urls],
        executable=convert.to_json(message.executable),
        tags=list(message.tags),
        notes=message.notes,
        requester=requester,
        now=now or timezone.now(),
    )
    if connection.in_atomic_block:  # durable: refused, or (in a test) in this thread's transaction
        [op], created = _create_batch(xid, [request])
        # Created in this transaction: no artifact can be attached yet, so no notify-when.
        outbox.send_on_commit(created, notify_when="")
        return op
    return _CREATES.submit(xid, request)


class _WidTaken(Exception):
    """A wid this batch meant to insert was committed by another transaction while the batch waited for the
    experiment lock (the lock read's snapshot predates it): roll back and read again."""


def _create_batch(xid: int, requests: list[_Create]) -> tuple[list[Operation], list[Operation]]:
    """Carry out ``requests`` (creates of experiment ``xid``, in arrival order) in one transaction.

    Returns each request's operation and the operations it created (to be
    delivered to the broker once committed).
    """
    for _ in range(3):
        try:
            with transaction.atomic(durable=True):
                return _create_locked(xid, requests)
        except _WidTaken:
            continue
    raise Aborted(f"experiments/{xid}: concurrent creates kept taking the same work unit ids; retry",
                  field="work_unit_id")


def _create_and_deliver(xid: int, requests: list[_Create]) -> tuple[list[Operation], Callable[[], None] | None]:
    """`_create_batch` for group commit: the delivery runs once the callers have their answers."""
    ops, created = _create_batch(xid, requests)
    # Created in this transaction: no artifact can be attached yet, so no notify-when.
    return ops, (partial(outbox.deliver_safely, created, notify_when="") if created else None)


_CREATES: GroupCommit[int, _Create, Operation] = GroupCommit(_create_and_deliver, max_batch=CREATE_BATCH_MAX)


def _create_locked(xid: int, requests: list[_Create]) -> tuple[list[Operation], list[Operation]]:
    """The body of `_create_batch`; the caller holds the transaction. Returns (per request, created)."""
    explicit = sorted({r.work_unit_id for r in requests if r.work_unit_id})
    # The lock serializes creates of one experiment (across processes too): a
    # create of a wid another one made waits here and then finds it.
    exp, highest, existing = _lock_for_create(xid, explicit)
    last = max(exp.last_wid, highest)
    first_of: dict[int, int] = {}
    wids: list[int] = []
    new: list[tuple[int, WorkUnit, Operation]] = []
    for i, request in enumerate(requests):
        wid = request.work_unit_id or last + 1
        wids.append(wid)
        if wid in existing or wid in first_of:
            continue
        if wid > limits.MAX_ID:  # pragma: no cover - explicit ids are bounded far below
            raise FailedPrecondition(f"experiments/{xid} has no work unit ids left", field="parent")
        first_of[wid] = i
        last = max(last, wid)
        wu = WorkUnit(
            experiment=exp, wid=wid, work_unit_type=request.work_unit_type,
            priority=request.priority or exp.priority, create_time=request.now, update_time=request.now,
            urls=request.urls, executable=request.executable, tags=request.tags, notes=request.notes,
            current_eid=1, current_state=S.INITIALIZING, current_start=request.now,
            args=(args := arguments.flat_args(request.executable)),
            arg_numbers=arguments.numbers(args),
        )
        op = Operation(
            experiment=exp, action_type=ActionType.CREATE, target=wu.name, create_time=request.now,
            original_requester=request.requester.email, asserted_email=request.requester.asserted_email,
            task_type=TaskType.CREATE, eid=1,
        )
        new.append((i, wu, op))
    rollup_fields: list[str] = []
    if new:
        exp.last_wid = max(exp.last_wid, max(wu.wid for _, wu, _ in new))
        rollup_fields = experiment_services.fold_rollup(
            exp, state_moves=[(None, S.INITIALIZING)] * len(new), severity_moves=(),
            now=max(requests[i].now for i, _, _ in new), extra_fields=("last_wid",),
        )
        _insert_created(exp, rollup_fields, [(wu, op) for _, wu, op in new])
        argument_stats.record(exp.id, (wu for _, wu, _ in new))
    results: list[Operation | None] = [None] * len(requests)
    for i, wu, op in new:
        results[i] = op
        log.info("workunit.created", extra={"xid": xid, "wid": wu.wid, "operation": op.id})
    for i, (request, wid) in enumerate(zip(requests, wids)):
        if results[i] is not None:
            continue
        if wid in first_of:  # the same id twice in this batch: the second is a retry of the first
            results[i] = results[first_of[wid]]
        elif (op_id := existing[wid]) is not None:
            results[i] = Operation.objects.select_related("work_unit").get(id=op_id)
        else:
            results[i] = _replay_deleted_create(exp, wid, request.requester, request.now)
    return results, [op for _, _, op in new]  # type: ignore[return-value]


def _replay_deleted_create(exp: Experiment, wid: int, requester: Requester, now: datetime) -> Operation:
    """The work unit exists but the client deleted its CREATE operation (DeleteOperation) and
    retries: still idempotent. Answer with a fresh, already-done operation carrying the work unit."""
    existing = WorkUnit.objects.get(experiment_id=exp.id, wid=wid)
    op = Operation.objects.create(
        experiment_id=exp.id, work_unit=existing, action_type=ActionType.CREATE, target=existing.name,
        create_time=now, end_time=now, done=True,
        response=convert.packed_json(work_unit_to_proto(existing)),
        original_requester=requester.email, asserted_email=requester.asserted_email,
        dispatched_time=now,
    )
    log.info("workunit.create_replayed", extra={"xid": exp.id, "wid": wid, "operation": op.id})
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


def _lock_for_create(xid: int, wids: Sequence[int]) -> tuple[Experiment, int, dict[int, int | None]]:
    """Lock experiment ``xid`` and read what its creates need, in one statement.

    Returns the experiment (only `_CREATE_LOCK_FIELDS` loaded), its highest
    wid (0 if none), and for each of ``wids`` that exists the id of its
    first CREATE operation (None when the client deleted it).
    """
    sql = _SQL.get("lock")
    if sql is None:
        qn = connection.ops.quote_name
        fields: list[Any] = [Experiment._meta.get_field(name) for name in _CREATE_LOCK_FIELDS]
        wu, op = qn(WorkUnit._meta.db_table), qn(Operation._meta.db_table)
        sql = _SQL["lock"] = (
            f"SELECT {', '.join('e.' + qn(f.column) for f in fields)}, "
            f"(SELECT max(w.wid) FROM {wu} w WHERE w.experiment_id = e.id), "
            f"(SELECT json_agg(json_build_array(w.wid, (SELECT o.id FROM {op} o WHERE o.work_unit_id = w.id "
            f"AND o.action_type = '{ActionType.CREATE.value}' ORDER BY o.id LIMIT 1))) "
            f"FROM {wu} w WHERE w.experiment_id = e.id AND w.wid = ANY(%s::bigint[])) "
            f"FROM {qn(Experiment._meta.db_table)} e WHERE e.id = %s FOR NO KEY UPDATE OF e"
        )
    cursor = kept_cursor()
    cursor.execute(sql, [int_array(wids), xid])
    row = cursor.fetchone()
    if row is None:
        raise NotFound(f"experiments/{xid} not found", field="parent")
    n = len(_CREATE_LOCK_FIELDS)
    values = [
        _loads(value) if name in ("child_state_counts", "message_severity_counts")
        else value
        for name, value in zip(_CREATE_LOCK_FIELDS, row[:n])
    ]
    exp = Experiment.from_db(connection.alias, list(_CREATE_LOCK_FIELDS), values)
    return exp, row[n] or 0, {wid: op_id for wid, op_id in (_loads(row[n + 1]) or ())}


#: The parts of the create statement: alias, model, columns taken from other parts (SQL), FROM clause.
_CREATE_PARTS: tuple[tuple[str, Any, dict[str, str], str], ...] = (
    ("w", WorkUnit, {}, "r"),
    ("o", Operation, {"work_unit_id": "w.id"}, "r JOIN w ON w.wid = r.{wid}"),
    ("x", WorkUnitExecution, {"work_unit_id": "w.id"}, "r JOIN w ON w.wid = r.{wid}"),
    ("h", StatusHistory, {"execution_id": "x.id", "operation_id": "o.id"},
     "r JOIN w ON w.wid = r.{wid} JOIN x ON x.work_unit_id = w.id JOIN o ON o.work_unit_id = w.id"),
)


@cache
def _create_fields() -> tuple[tuple[str, Any], ...]:
    """(alias, field) of every value the create statement takes from its recordset, in recordset order."""
    return tuple(
        (alias, f)
        for alias, model, refs, _ in _CREATE_PARTS
        for f in model._meta.concrete_fields
        if not f.primary_key and f.column not in refs
    )


def _create_sql(rollup_fields: tuple[str, ...]) -> str:
    """The create statement for one roll-up field list (cached): every row of every part, and the roll-up.

    The rows arrive as one ``jsonb_to_recordset`` parameter (a column per
    model field, ``c<i>`` in `_create_fields` order, typed as the model's
    column: short names keep the statement under psycopg's 4096 bytes for
    caching its conversion), so one
    statement inserts any number of work units with their operations,
    executions and first history rows. The work units' insert is ``ON
    CONFLICT DO NOTHING`` and every other part joins it, so a taken wid
    writes nothing of its own; the roll-up is written only if every work
    unit was (the caller rolls back otherwise).
    """
    cached = _SQL.get(rollup_fields)
    if cached is not None:
        return cached
    qn = connection.ops.quote_name
    column = {(alias, f.column): f"c{i}" for i, (alias, f) in enumerate(_create_fields())}
    recordset = ", ".join(f"{column[alias, f.column]} {f.db_type(connection)}" for alias, f in _create_fields())
    ctes = [f"r AS (SELECT * FROM jsonb_to_recordset(%s::jsonb) AS r(n integer, {recordset}))"]
    for alias, model, refs, source in _CREATE_PARTS:
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        values = ", ".join(refs.get(f.column) or f"r.{column[alias, f.column]}" for f in fields)
        returning = {"w": "id, wid", "o": "id, work_unit_id", "x": "id, work_unit_id", "h": "id"}[alias]
        conflict = " ON CONFLICT (experiment_id, wid) DO NOTHING" if alias == "w" else ""
        ctes.append(
            f"{alias} AS (INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
            f"SELECT {values} FROM {source.format(wid=column['w', 'wid'])} ORDER BY r.n{conflict} "
            f"RETURNING {returning})"
        )
    exp_fields: list[Any] = [Experiment._meta.get_field(name) for name in rollup_fields]
    assignments = ", ".join(f"{qn(f.column)} = CAST(%s AS {f.db_type(connection)})" for f in exp_fields)
    ctes.append(f"e AS (UPDATE {qn(Experiment._meta.db_table)} SET {assignments} "
                f"WHERE id = %s AND (SELECT count(*) FROM w) = %s RETURNING id)")
    sql = _SQL[rollup_fields] = f"WITH {', '.join(ctes)} SELECT w.wid, w.id, o.id FROM w JOIN o ON o.work_unit_id = w.id"
    return sql


def _recordset_value(field: Any, value: Any) -> Any:
    value = field.get_prep_value(value)
    return value.isoformat() if isinstance(value, datetime) else value


def _insert_created(exp: Experiment, rollup_fields: Sequence[str], created: Sequence[tuple[WorkUnit, Operation]]) -> None:
    """Insert work units, their CREATE operations, executions 1 and first history rows, and write the
    experiment's roll-up, all in one statement (`_create_sql`); raises `_WidTaken` if a wid exists.

    Sets the ids on each work unit and operation as ``objects.create`` would.
    """
    fields = _create_fields()
    rows = []
    for n, (wu, op) in enumerate(created):
        now = wu.create_time
        objects = {
            "w": wu,
            "o": op,
            "x": WorkUnitExecution(
                eid=1, execution_state=ExecutionState.ACTIVE, create_time=now, update_time=now,
                state=S.INITIALIZING, state_update_time_ns=_now_ns(now), metadata=_execution_metadata(wu),
            ),
            "h": StatusHistory(time=now, from_state="", to_state=S.INITIALIZING, writer=Writer.STATE_SERVER,
                               extra={"insert": True}),
        }
        row: dict[str, Any] = {"n": n}
        for i, (alias, f) in enumerate(fields):
            row[f"c{i}"] = _recordset_value(f, getattr(objects[alias], f.attname))
        rows.append(row)
    sql = _create_sql(tuple(rollup_fields))
    params: list[Any] = [_dumps(rows)]
    exp_fields: list[Any] = [Experiment._meta.get_field(name) for name in rollup_fields]
    params += [f.get_db_prep_save(getattr(exp, f.name), connection) for f in exp_fields]
    params += [exp.id, len(created)]
    cursor = kept_cursor()  # server-side binding: no quoting of the executables into the SQL
    cursor.execute(sql, params)
    ids = {wid: (wu_id, op_id) for wid, wu_id, op_id in cursor.fetchall()}
    if len(ids) != len(created):
        raise _WidTaken
    for wu, op in created:
        wu.id, op.id = ids[wu.wid]
        op.work_unit = wu
        for obj in (wu, op):
            obj._state.adding = False
            obj._state.db = connection.alias
