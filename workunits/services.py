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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache, partial
from typing import Any, NamedTuple

import orjson
from django.db import connection, transaction
from django.db.models import F, Field, Q
from django.utils import timezone

from experiments import services as experiment_services
from experiments.models import Experiment
from lifecycle.hooks import on_execution_superseded
from workunits import outbox, state
from workunits.group_commit import GroupCommit
from workunits.choices import (
    TERMINAL,
    ActionType,
    ExecutionState,
    TaskType,
    WorkUnitState,
    WorkUnitType,
    Writer,
)
from core import convert, limits, pb
from core.db import int_array, kept_cursor
from core.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from jobsets.validation import validate_executable, validate_work_unit_request
from workunits.models import DeadLetter, Operation, StatusHistory, StatusMessage, WorkUnit, WorkUnitExecution
from workunits.state import ExecutionRecord, ExecutionUpdate, Merge
from workunits.wire import execution_record, work_unit_fields, work_unit_to_proto

log = logging.getLogger(__name__)
S = WorkUnitState


class Transition(NamedTuple):
    """A committed state change, returned for publishing after commit (a named tuple: one per change)."""

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
            current_eid=1,
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
        return cached  # type: ignore[no-any-return]
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


class InvalidUpdates(InvalidArgument):
    """One or more updates of a batch are malformed; nothing of the batch was written.

    ``invalid`` pairs each offending update (one that passed the EID fence)
    with its error, so a caller that batches independent updates (the
    reconciler's batcher) can drop exactly those and retry the rest.
    ``field`` is the field of the first error.
    """

    def __init__(self, invalid: Sequence[tuple[ExecutionUpdate, InvalidArgument]]) -> None:
        self.invalid = tuple(invalid)
        first = self.invalid[0][1]
        names = "; ".join(
            f"experiments/{u.xid}/workUnits/{u.wid}/executions/{u.eid}: {e.message}" for u, e in self.invalid
        )
        super().__init__(f"{len(self.invalid)} invalid update(s): {names}", field=first.field)

    @property
    def keys(self) -> tuple[tuple[int, int, int], ...]:
        """``(xid, wid, eid)`` of every offending update, in batch order."""
        return tuple((u.xid, u.wid, u.eid) for u, _ in self.invalid)


def update_work_unit_executions(
    updates: Sequence[ExecutionUpdate], *, now: datetime | None = None
) -> list[Transition]:
    """Apply a batch of masked execution updates in one durable transaction.

    Updates for a work unit that does not exist, or for an execution that is
    not current (EID fence), are skipped silently whatever they hold. Every
    other update is validated before anything is written: one malformed
    update (unknown path, unknown state, missing state_update_time) fails the
    whole batch with ``InvalidUpdates`` (an INVALID_ARGUMENT naming the
    offending updates) and nothing is written. Returns the committed state
    transitions; the caller publishes lifecycle events for them after commit.
    """
    if not updates:
        return []
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        return _apply_updates(updates, now)


def update_work_unit_executions_in_transaction(
    updates: Sequence[ExecutionUpdate], *, now: datetime
) -> list[Transition]:
    """``update_work_unit_executions`` for a service that already holds its transaction.

    The pause handler (``workunits.scheduling.hold_task``) stores its
    PausedTask row and moves the execution to SCHEDULING_PAUSED in one
    transaction, so it cannot open a second durable one.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("update_work_unit_executions_in_transaction needs an open transaction")
    state.validate_updates(updates)
    return _apply_updates(updates, now) if updates else []


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


class _Locked(NamedTuple):
    """The slim view of a locked work unit the write path needs (a named tuple: one per work unit)."""

    id: int
    xid: int
    wid: int
    current_eid: int


def _lock_work_unit_rows(keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], _Locked]:
    """``_lock_work_units`` without model objects: same rows, same (xid, wid) order.

    Postgres locks the rows as the sort emits them, so the lock order is the
    ``ORDER BY``; a row changed by a transaction we waited for is re-read
    (its committed ``current_eid`` is what we get).
    """
    ordered = sorted(set(keys))
    if not ordered:
        return {}
    cursor = kept_cursor()  # kept by the connection: not closed here
    cursor.execute(_LOCK_SQL, [int_array(k[0] for k in ordered), int_array(k[1] for k in ordered)])
    return {(xid, wid): _Locked(id_, xid, wid, eid) for id_, xid, wid, eid in cursor.fetchall()}


_WU = WorkUnit._meta.db_table
_EX = WorkUnitExecution._meta.db_table
_HISTORY = StatusHistory._meta.db_table
_MESSAGE = StatusMessage._meta.db_table

_LOCK_SQL = f"""
SELECT wu.id, wu.experiment_id, wu.wid, wu.current_eid
FROM {_WU} AS wu
JOIN unnest(%s::bigint[], %s::bigint[]) AS k(xid, wid) ON wu.experiment_id = k.xid AND wu.wid = k.wid
ORDER BY wu.experiment_id, wu.wid
FOR NO KEY UPDATE OF wu
"""

# A separate statement (a new snapshot under READ COMMITTED) after the lock,
# so an execution inserted by a restart we waited for is the one we read.
_READ_SQL = f"""
SELECT id, work_unit_id, eid, state, state_update_time_ns, system_message, user_message,
       scheduling_information, detailed_status, metadata ->> 'mlrunUrl', complete_time
FROM {_EX}
WHERE work_unit_id = ANY(%s::bigint[]) AND execution_state = '{ExecutionState.ACTIVE}'
"""

_UPDATE_SQL = f"""
UPDATE {_EX} AS e SET
    state = v.state,
    state_update_time_ns = v.state_update_time_ns,
    system_message = v.system_message,
    user_message = v.user_message,
    scheduling_information = v.scheduling_information,
    detailed_status = v.detailed_status,
    metadata = CASE WHEN v.mlrun_url <> ''
                    THEN COALESCE(e.metadata, '{{}}'::jsonb) || jsonb_build_object('mlrunUrl', v.mlrun_url)
                    ELSE COALESCE(e.metadata, '{{}}'::jsonb) - 'mlrunUrl' END,
    complete_time = v.complete_time,
    update_time = %(now)s
FROM jsonb_to_recordset(%(executions)s::jsonb) AS v(
    id bigint, state text, state_update_time_ns bigint, system_message jsonb, user_message jsonb,
    scheduling_information jsonb, detailed_status jsonb, mlrun_url text, complete_time timestamptz)
WHERE e.id = v.id
RETURNING 1
"""

_HISTORY_INSERT = f"""
INSERT INTO {_HISTORY} (execution_id, time, from_state, to_state, writer, operation_id, request_id, extra)
SELECT h.execution_id, %(now)s, h.from_state, h.to_state, h.writer, h.operation_id, h.request_id, h.extra
FROM jsonb_to_recordset(%(history)s::jsonb) AS h(
    n int, execution_id bigint, from_state text, to_state text, writer text, operation_id bigint,
    request_id text, extra jsonb)
ORDER BY h.n
"""

_MESSAGE_INSERT = f"""
INSERT INTO {_MESSAGE} (experiment_id, work_unit_id, execution_id, content, severity, source, kind, create_time)
SELECT m.experiment_id, m.work_unit_id, m.execution_id, m.content, m.severity, m.source, m.kind, %(now)s
FROM jsonb_to_recordset(%(messages)s::jsonb) AS m(
    n int, experiment_id bigint, work_unit_id bigint, execution_id bigint, content jsonb, severity text,
    source text, kind text)
ORDER BY m.n
"""

# The executions' UPDATE, the history and (when there are any) the messages in one
# statement of data-modifying CTEs: one round trip instead of two or three. Under
# load each round trip of a writer thread also waits to get the GIL back.
_WRITE_SQL = f"WITH updated AS ({_UPDATE_SQL}) {_HISTORY_INSERT}"
_WRITE_WITH_MESSAGES_SQL = f"WITH updated AS ({_UPDATE_SQL}), history AS ({_HISTORY_INSERT}) {_MESSAGE_INSERT}"


def _loads(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str) else value


def _read_executions(work_unit_ids: Sequence[int]) -> dict[int, tuple[int, int, ExecutionRecord]]:
    """work unit id -> (execution id, eid, record) of its ACTIVE execution."""
    cursor = kept_cursor()
    cursor.execute(_READ_SQL, [int_array(work_unit_ids)])
    rows = cursor.fetchall()
    return {  # positional, in ExecutionRecord's field order: one is built per execution of the batch
        wu_id: (ex_id, eid, ExecutionRecord(
            st, t, _loads(system), _loads(user), _loads(scheduling), _loads(detailed), mlrun or "",
            convert.ns_from_datetime(complete) if complete else None,
        ))
        for ex_id, wu_id, eid, st, t, system, user, scheduling, detailed, mlrun, complete in rows
    }


def _stamp(message: state.Message, now: datetime) -> dict[str, Any]:
    stamped = dict(message)
    stamped.setdefault("createTime", convert.timestamp(now).ToJsonString())  # type: ignore[union-attr]
    return stamped


def _execution_row(ex_id: int, record: ExecutionRecord) -> dict[str, Any]:
    """One row of the UPDATE's recordset; empty or ``None`` fields are stored as SQL NULL.

    The record's JSON fields are already dicts of their own (read with
    orjson, or copied by ``state.merge_execution``), so they go in as they are.
    """
    return {
        "id": ex_id,
        "state": record.state,
        "state_update_time_ns": record.state_update_time_ns,
        "system_message": record.system_message or None,
        "user_message": record.user_message or None,
        "scheduling_information": record.scheduling_information or None,
        "detailed_status": record.detailed_status or None,
        "mlrun_url": record.mlrun_url,
        # The same (microsecond) value the model field would have stored.
        "complete_time": (
            convert.datetime_from_ns(record.complete_time_ns).isoformat() if record.complete_time_ns else None
        ),
    }


def _dumps(rows: Sequence[dict[str, Any]]) -> str:
    """Compact JSON text for a ``jsonb_to_recordset`` parameter (orjson: ~8x ``json.dumps``)."""
    try:
        return orjson.dumps(rows).decode()
    except TypeError:  # an int beyond 64 bits (orjson refuses it): the standard encoder takes it
        return json.dumps(rows, separators=(",", ":"))


def _apply_updates(updates: Sequence[ExecutionUpdate], now: datetime) -> list[Transition]:
    """The body of ``update_work_unit_executions``; caller holds the transaction.

    Five statements whatever the batch size (seven round trips with BEGIN
    and COMMIT): lock, read, one statement that updates every changed
    execution and inserts the history (and messages), the experiments' lock
    and one roll-up UPDATE for all of them.
    """
    now_ns = _now_ns(now)
    work_units = _lock_work_unit_rows(u.key for u in updates)
    executions = _read_executions([wu.id for wu in work_units.values()]) if work_units else {}
    first: dict[int, ExecutionRecord] = {}
    records: dict[int, ExecutionRecord] = {}
    history: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    transitions: list[Transition] = []
    invalid: list[tuple[ExecutionUpdate, InvalidArgument]] = []

    for update in updates:
        wu = work_units.get(update.key)
        if wu is None:
            continue  # the work unit does not exist (deleted experiment): nothing to guard
        if state.is_fenced(update.eid, wu.current_eid):
            continue  # EID fence: an older (or unknown) execution; skipped silently, valid or not
        try:
            state.validate_update(update)
        except InvalidArgument as error:
            invalid.append((update, error))
            continue
        if invalid:
            continue  # the batch fails: only collect the other invalid updates
        ex_id, eid, stored = executions[wu.id]
        current = records.get(wu.id) or stored
        first.setdefault(wu.id, current)
        merge: Merge = state.merge_execution(current, update, now_ns)
        if not merge.changed:
            continue
        record = merge.record
        for kind, message in merge.new_messages:
            content = _stamp(message, now)
            if kind == "system" and record.system_message == message:
                record = record._replace(system_message=content)
            elif kind == "user" and record.user_message == message:
                record = record._replace(user_message=content)
            messages.append({
                "n": len(messages), "experiment_id": wu.xid, "work_unit_id": wu.id, "execution_id": eid,
                "content": content, "severity": content.get("severity", "SEVERITY_UNSPECIFIED"),
                "source": content.get("source", "SOURCE_UNSPECIFIED"), "kind": kind,
            })
        records[wu.id] = record
        history.append({
            "n": len(history), "execution_id": ex_id, "from_state": merge.old_state, "to_state": merge.new_state,
            "writer": update.writer, "operation_id": update.operation_id, "request_id": update.request_id,
            "extra": {"mask": update.mask, **update.extra} if update.extra else {"mask": update.mask},
        })
        if merge.state_changed:
            transitions.append(Transition(wu.xid, wu.wid, eid, merge.old_state, merge.new_state))

    if invalid:
        raise InvalidUpdates(invalid)
    if not records:
        return []
    params = {
        "now": now, "history": _dumps(history),
        "executions": _dumps([_execution_row(executions[w][0], r) for w, r in records.items()]),
    }
    if messages:
        params["messages"] = _dumps(messages)
    kept_cursor().execute(_WRITE_WITH_MESSAGES_SQL if messages else _WRITE_SQL, params)

    # Roll-up: one pass per experiment, experiments locked after work units.
    state_moves: dict[int, list[tuple[str | None, str | None]]] = defaultdict(list)
    severity_moves: dict[int, list[tuple[str | None, str | None]]] = defaultdict(list)
    xid_of = {wu.id: wu.xid for wu in work_units.values()}
    for wu_id, record in records.items():
        before = first[wu_id]
        xid = xid_of[wu_id]
        state_moves[xid].append((before.state, record.state))
        severity_moves[xid].append((state.best_severity(before), state.best_severity(record)))
    experiment_services.apply_rollups({xid: (state_moves[xid], severity_moves[xid]) for xid in state_moves}, now=now)
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

    The clock is read *after* the row locks are held, and the state is
    stamped at least the stored ``state_update_time``: a writer that
    committed while we waited (the pause handler, or a host whose clock runs
    ahead) can never make the timestamp guard drop STOPPED while the STOP
    operation and its DELETE task still go out.
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
                xid=xid, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE,), state=target,
                state_update_time_ns=max(_now_ns(now), ex.state_update_time_ns),
                writer=Writer.STATE_SERVER, operation_id=op.id,
            ))
        _apply_updates(updates, now)
        if parent is not None and not ops:
            _finish(parent, now, response=_batch_response(exp, []))
        outbox.send_on_commit(ops)
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
            severity_moves.append((state.best_severity(execution_record(old)), None))
            superseded.append((xid, wu.wid, old_eid))
        experiment_services.apply_rollups({xid: (state_moves, severity_moves)}, now=now)
        for xid_, wid_, eid_ in superseded:
            transaction.on_commit(partial(on_execution_superseded, xid_, wid_, eid_))
        outbox.send_on_commit(ops)
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


# --- Operation completion (the actuator's only writes) ---------------------------------


#: google.rpc.Code.CANCELLED
CANCELLED_CODE = 1


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
    if error is None and response is None and op.work_unit is not None:
        response = convert.packed_json(work_unit_to_proto(op.work_unit))
    fields = {"done": True, "end_time": now, "response": None if error else response, "error": error}
    if op.parent_id is None:
        return bool(Operation.objects.filter(id=operation_id, done=False).update(**fields))
    with transaction.atomic(durable=True):
        if not Operation.objects.filter(id=operation_id, done=False).update(**fields):
            return False
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
    now: datetime | None = None,
) -> DeadLetter:
    """Store a task that failed permanently or ran out of retries."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        if operation_id is not None and not Operation.objects.filter(id=operation_id).exists():
            operation_id = None
        return DeadLetter.objects.create(
            task_name=task_name, task_type=task_type, payload=payload, operation_id=operation_id,
            error_code=error_code, error_message=error_message[:10_000], attempts=attempts, created_time=now,
        )


def requeue_dead_letter(dead_letter_id: int, *, now: datetime | None = None) -> Operation:
    """Send a dead-lettered task's operation again (the admin's re-queue action).

    The task is rebuilt from the Operation row, never replayed from the stored
    payload (which may be the tampered one): the operation is reopened
    (``done``/``error``/``dispatched_time`` cleared) and handed to the outbox
    after commit. A dead letter without an operation cannot be re-queued.
    """
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        dead = DeadLetter.objects.select_for_update().get(id=dead_letter_id)
        if dead.operation_id is None:
            raise FailedPrecondition(
                f"dead letter {dead_letter_id} has no operation to send again (an invalid task)", field="operation"
            )
        op = Operation.objects.select_for_update(no_key=True).get(id=dead.operation_id)
        op.done = False
        op.end_time = None
        op.error = None
        op.response = None
        op.dispatched_time = None
        op.save(update_fields=["done", "end_time", "error", "response", "dispatched_time"])
        if op.parent_id is not None:
            Operation.objects.filter(id=op.parent_id, done=True).update(done=False, end_time=None, error=None,
                                                                       response=None)
        dead.requeued_time = now
        dead.save(update_fields=["requeued_time"])
        outbox.send_on_commit([op])
        return op


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


# --- Execution metadata (reconciler) -----------------------------------------------------


_ADMISSION_FIELDS = frozenset({"resourceFlavor", "nodeSelectors", "multiKueueClusterName"})


def record_execution_metadata(
    items: Sequence[tuple[int, int, int, dict[str, Any]]], *, now: datetime | None = None
) -> int:
    """Merge observed ``WorkUnitExecutionMetadata`` fields into current executions.

    ``items`` are ``(xid, wid, eid, fields)`` with proto3 JSON field names
    (``resourceName``, ``namespace``, ``resourceFlavor``, ``nodeSelectors``,
    ``multiKueueClusterName``, ``executingCluster``, ``managementCluster``);
    the reconciler writes them when admission tells it where an execution
    runs. Fenced like every execution write (only the current execution; a
    missing work unit is skipped); ``type`` and ``mlrunUrl`` are never touched.
    One durable transaction; returns how many executions changed.
    """
    allowed = {"resourceName", "namespace", "resourceFlavor", "nodeSelectors", "multiKueueClusterName",
               "executingCluster", "managementCluster", "serviceAccount"}
    for _, _, _, fields in items:
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise InvalidArgument(f"metadata fields {unknown} are not observable", field="metadata")
    if not items:
        return 0
    now = now or timezone.now()
    changed = 0
    with transaction.atomic(durable=True):
        work_units = _lock_work_units((xid, wid) for xid, wid, _, _ in items)
        for xid, wid, eid, fields in items:
            wu = work_units.get((xid, wid))
            if wu is None or state.is_fenced(eid, wu.current_eid):
                continue
            ex = WorkUnitExecution.objects.filter(work_unit=wu, eid=eid).first()
            if ex is None:
                continue
            metadata = dict(ex.metadata or {})
            merged = {**metadata, **fields}
            for name in _ADMISSION_FIELDS - set(fields):
                merged.pop(name, None)  # no admission now: the flavor no longer applies
            if merged == metadata:
                continue
            ex.metadata = merged
            ex.update_time = now
            ex.save(update_fields=["metadata", "update_time"])
            changed += 1
    return changed
