"""The guarded write path of executions: masked updates (the reconciler's, the actuator's, the lifecycle's).

``update_work_unit_executions`` locks the work units (``(xid, wid)`` order),
reads the executions, runs the pure guards of ``workunits.state`` and writes
every accepted change, its history row and its messages in one statement of
raw SQL; it returns the committed :class:`~workunits.hooks.Transition` values
for the caller to publish after commit. ``record_execution_metadata`` records
the admission details the reconciler sees.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
import orjson

from core import convert
from core.db import int_array, kept_cursor
from core.errors import InvalidArgument
from experiments import services as experiment_services
from workunits import state
from workunits.choices import ExecutionState
from workunits.hooks import Transition
from workunits.models import StatusHistory, StatusMessage, WorkUnit, WorkUnitExecution
from workunits.services._rows import _now_ns
from workunits.state import ExecutionRecord, ExecutionUpdate, Merge


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


_WU = WorkUnit._meta.db_table
_EX = WorkUnitExecution._meta.db_table


_EX = WorkUnitExecution._meta.db_table
_HISTORY = StatusHistory._meta.db_table


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
RETURNING e.work_unit_id, e.state, e.complete_time
"""


# The work unit's copy of its current execution's state and end (`WorkUnit.current_state`), in the
# same statement as the execution; a row whose copy already holds them is not written again.
_UNIT_SQL = f"""
UPDATE {_WU} AS w SET current_state = u.state, current_end = u.complete_time
FROM updated AS u
WHERE w.id = u.work_unit_id AND (w.current_state, w.current_end) IS DISTINCT FROM (u.state, u.complete_time)
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


# The executions' UPDATE, their work units' copies, the history and (when there are any) the
# messages in one statement of data-modifying CTEs: one round trip instead of several. Under
# load each round trip of a writer thread also waits to get the GIL back.
_WRITE_SQL = f"WITH updated AS ({_UPDATE_SQL}), units AS ({_UNIT_SQL}) {_HISTORY_INSERT}"
_WRITE_WITH_MESSAGES_SQL = (f"WITH updated AS ({_UPDATE_SQL}), units AS ({_UNIT_SQL}), history AS ({_HISTORY_INSERT}) "
                            f"{_MESSAGE_INSERT}")


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
