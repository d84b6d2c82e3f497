"""The API's hot reads: one SQL statement each, no model objects.

Every client polls GetWorkUnit / GetCurrentWorkUnitExecution /
GetExperiment, so these run one hand-written statement that starts from the
experiment row (its ACLs decide access) and LEFT JOINs the work unit and its
execution, then check the caller's role (permission first, `xmc.api.access`) and
shape the row into the API message through the one conversion module
(`core.convert`) -- the response is byte-for-byte what the ORM path built.

Rows are read with a raw cursor into small slotted records (`ExperimentRow`,
`WorkUnitRow`, `ExecutionRow`) that carry exactly the attributes `core.convert`
reads; building Django model instances (and decoding columns the response
never uses) cost more than the query itself.

Order of checks (`_require`): a missing experiment or work unit is NOT_FOUND,
then the role is checked -- the same order as the ORM path. Because the one
row holds the experiment's ACLs even when the work unit is missing, the
"permission first" order (AIP-211) is a change inside `_require` only.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from core import pb

from experiments.wire import experiment_status_to_proto, experiment_to_proto

from core.db import kept_cursor
from core.errors import NotFound
from experiments.acl import Role
from experiments.models import Experiment
from workunits.choices import ExecutionState
from workunits.models import WorkUnit, WorkUnitExecution
from workunits.wire import execution_to_proto, work_unit_to_proto
from xmc.api import access
from xmc.auth.identity import Identity

_EXPERIMENTS = Experiment._meta.db_table
_WORK_UNITS = WorkUnit._meta.db_table
_EXECUTIONS = WorkUnitExecution._meta.db_table


def _json(value: Any) -> Any:
    """A jsonb column as Django's JSONField would decode it (Django loads jsonb as text)."""
    return json.loads(value) if isinstance(value, str) else value


# --- Row records (what core.convert reads, nothing more) ------------------------------------


class ExperimentRow:
    __slots__ = ("id", "title", "creator", "acls", "priority", "create_time", "update_time", "complete_time",
                 "urls", "tags", "notes", "resources", "active_state", "launch_state", "launch_id",
                 "child_state_counts", "message_severity_counts", "last_child_status_update_time",
                 "status_update_time", "structured_status_message")
    COLUMNS = ("id", "title", "creator", "acls", "priority", "create_time", "update_time", "complete_time",
               "urls", "tags", "notes", "resources", "active_state", "launch_state", "launch_id",
               "child_state_counts", "message_severity_counts", "last_child_status_update_time",
               "status_update_time", "structured_status_message")
    JSON = frozenset({"acls", "urls", "resources", "child_state_counts", "message_severity_counts",
                      "structured_status_message"})
    id: int

    @property
    def name(self) -> str:
        return f"experiments/{self.id}"


class WorkUnitRow:
    __slots__ = ("experiment_id", "id", "wid", "work_unit_type", "priority", "create_time", "update_time", "urls",
                 "executable", "tags", "notes", "current_eid")
    COLUMNS = ("id", "wid", "work_unit_type", "priority", "create_time", "update_time", "urls", "executable",
               "tags", "notes", "current_eid")
    JSON = frozenset({"urls", "executable"})
    experiment_id: int
    wid: int
    current_eid: int

    @property
    def name(self) -> str:
        return f"experiments/{self.experiment_id}/workUnits/{self.wid}"


class ExecutionRow:
    __slots__ = ("eid", "execution_state", "create_time", "update_time", "complete_time", "state",
                 "state_update_time_ns", "system_message", "user_message", "scheduling_information",
                 "detailed_status", "metadata")
    COLUMNS = __slots__
    JSON = frozenset({"system_message", "user_message", "scheduling_information", "detailed_status", "metadata"})


def _select(alias: str, record: type) -> str:
    return ", ".join(f"{alias}.{column}" for column in record.COLUMNS)  # type: ignore[attr-defined]


def _fill(record: type, values: Sequence[Any]) -> Any:
    """A ``record`` from ``values`` in ``record.COLUMNS`` order, or None when the LEFT JOIN found nothing."""
    columns: tuple[str, ...] = record.COLUMNS  # type: ignore[attr-defined]
    if values[0] is None:
        return None
    obj: Any = object.__new__(record)
    json_columns: frozenset[str] = record.JSON  # type: ignore[attr-defined]
    for column, value in zip(columns, values):
        setattr(obj, column, _json(value) if column in json_columns else value)
    return obj


def _fetch(sql: str, params: Sequence[Any], *, many: bool = False) -> Any:
    cursor = kept_cursor()  # kept by the connection: not closed here
    cursor.execute(sql, params)
    return cursor.fetchall() if many else cursor.fetchone()


# --- Access ------------------------------------------------------------------------------------


def _require(identity: Identity, acls: Any, needed: Role, *, missing: str | None, resource: str,
             field: str = "name") -> None:
    """Permission first (AIP-211, `xmc.api.access`): ``acls`` None means the experiment is missing.

    A caller who may not read the experiment gets PERMISSION_DENIED whether
    or not it (or ``missing``, a child's name) exists; only a reader learns
    that a child is NOT_FOUND.
    """
    if acls is None or missing is None:
        access.require(identity, acls, needed, resource=resource, field=field)
        return
    raise access.missing_child(identity, acls, needed, resource=missing, field=field)


# --- Experiments ---------------------------------------------------------------------------------

_EXPERIMENT_SQL = f"SELECT {_select('e', ExperimentRow)} FROM {_EXPERIMENTS} e WHERE e.id = %s"


def experiment(xid: int, identity: Identity, needed: Role = Role.READER) -> ExperimentRow:
    """The experiment ``xid`` as a row record, after the access check (one statement)."""
    row = _fetch(_EXPERIMENT_SQL, [xid])
    exp = _fill(ExperimentRow, row) if row else None
    name = f"experiments/{xid}"
    _require(identity, exp.acls if exp else None, needed, missing=None, resource=name)
    return cast(ExperimentRow, exp)


_ACLS_SQL = f"SELECT e.acls FROM {_EXPERIMENTS} e WHERE e.id = %s"


def require_acls(xid: int, acls: Any, identity: Identity, needed: Role, field: str = "name") -> None:
    """The access check on ACLs already read (``None``: the experiment does not exist)."""
    _require(identity, _json(acls), needed, missing=None, resource=f"experiments/{xid}", field=field)


def execution_row(data: dict[str, Any] | None) -> ExecutionRow | None:
    """An `ExecutionRow` from the JSON object a list query builds per row (`ExecutionRow.COLUMNS` as keys)."""
    if data is None:
        return None
    obj: Any = object.__new__(ExecutionRow)
    for column in ExecutionRow.COLUMNS:
        value = data.get(column)
        if column in _EXECUTION_TIMES and isinstance(value, str):
            value = datetime.fromisoformat(value)
        setattr(obj, column, value)
    return cast(ExecutionRow, obj)


_EXECUTION_TIMES = frozenset({"create_time", "update_time", "complete_time"})


def require_experiment_role(xid: int, identity: Identity, needed: Role, field: str = "name") -> None:
    """The access check alone, reading only the experiment's ACLs (one statement)."""
    row = _fetch(_ACLS_SQL, [xid])
    require_acls(xid, row[0] if row else None, identity, needed, field=field)


def get_experiment(xid: int, identity: Identity) -> pb.experiment.Experiment:
    return experiment_to_proto(cast(Any, experiment(xid, identity)))


def get_experiment_status(xid: int, identity: Identity) -> pb.status.ExperimentStatus:
    return experiment_status_to_proto(cast(Any, experiment(xid, identity)))


# --- Work units and executions ---------------------------------------------------------------------

_WU = _select("w", WorkUnitRow)
_EX = _select("x", ExecutionRow)
_ACTIVE = ExecutionState.ACTIVE.value

# Starts from the experiment (its ACLs), LEFT JOINs the work unit and one execution:
# a row exists iff the experiment does; w.id is NULL iff the work unit is missing.
_WORK_UNIT_SQL = (
    f"SELECT e.acls, {_WU}, {_EX} FROM {_EXPERIMENTS} e "
    f"LEFT JOIN {_WORK_UNITS} w ON w.experiment_id = e.id AND w.wid = %s "
    f"LEFT JOIN {_EXECUTIONS} x ON x.work_unit_id = w.id AND x.execution_state = '{_ACTIVE}' "
    f"WHERE e.id = %s"
)
# GetCurrentWorkUnitExecution reads the execution the work unit points at (current_eid).
_CURRENT_EXECUTION_SQL = (
    f"SELECT e.acls, {_WU}, {_EX} FROM {_EXPERIMENTS} e "
    f"LEFT JOIN {_WORK_UNITS} w ON w.experiment_id = e.id AND w.wid = %s "
    f"LEFT JOIN {_EXECUTIONS} x ON x.work_unit_id = w.id AND x.eid = w.current_eid "
    f"WHERE e.id = %s"
)
# Every execution, oldest first: one row per execution (one row with NULLs when there is none).
_EXECUTIONS_SQL = (
    f"SELECT e.acls, {_WU}, {_EX} FROM {_EXPERIMENTS} e "
    f"LEFT JOIN {_WORK_UNITS} w ON w.experiment_id = e.id AND w.wid = %s "
    f"LEFT JOIN {_EXECUTIONS} x ON x.work_unit_id = w.id "
    f"WHERE e.id = %s ORDER BY x.eid"
)
_N_WU = len(WorkUnitRow.COLUMNS)


def _split(xid: int, row: Sequence[Any]) -> tuple[Any, WorkUnitRow | None, ExecutionRow | None]:
    acls = _json(row[0])
    wu = _fill(WorkUnitRow, row[1:1 + _N_WU])
    if wu is not None:
        wu.experiment_id = xid
    return acls, wu, _fill(ExecutionRow, row[1 + _N_WU:])


def _work_unit_rows(sql: str, xid: int, wid: int, identity: Identity, needed: Role,
                    *, many: bool = False) -> tuple[WorkUnitRow, list[ExecutionRow]]:
    fetched = _fetch(sql, [wid, xid], many=many)
    rows = (fetched or []) if many else ([fetched] if fetched else [])
    name = f"experiments/{xid}/workUnits/{wid}"
    if not rows:
        _require(identity, None, needed, missing=None, resource=name)
    split = [_split(xid, row) for row in rows]
    acls, wu, _ = split[0]
    _require(identity, acls, needed, missing=None if wu else name, resource=name)
    return cast(WorkUnitRow, wu), [ex for _, _, ex in split if ex is not None]


def work_unit(xid: int, wid: int, identity: Identity, needed: Role = Role.READER) -> pb.work_unit.WorkUnit:
    """GetWorkUnit: the work unit with its ACTIVE execution, after the access check."""
    wu, executions = _work_unit_rows(_WORK_UNIT_SQL, xid, wid, identity, needed)
    return work_unit_to_proto(cast(Any, wu), cast(Any, executions[0]) if executions else None)


def current_execution(xid: int, wid: int, identity: Identity) -> pb.work_unit_execution.WorkUnitExecution:
    """GetCurrentWorkUnitExecution: the execution ``current_eid`` names."""
    wu, executions = _work_unit_rows(_CURRENT_EXECUTION_SQL, xid, wid, identity, Role.READER)
    if not executions:  # every work unit is created with its first execution
        raise NotFound(f"{wu.name}/executions/{wu.current_eid} not found", field="name")
    return execution_to_proto(cast(Any, executions[0]), cast(Any, wu))


def executions(xid: int, wid: int, identity: Identity) -> list[pb.work_unit_execution.WorkUnitExecution]:
    """ListWorkUnitExecutions: every execution of the work unit, by eid."""
    wu, rows = _work_unit_rows(_EXECUTIONS_SQL, xid, wid, identity, Role.READER, many=True)
    return [execution_to_proto(cast(Any, ex), cast(Any, wu)) for ex in rows]


_ACTIVE_EXECUTIONS_SQL = (
    f"SELECT x.work_unit_id, {_EX} FROM {_EXECUTIONS} x "
    f"WHERE x.work_unit_id = ANY(%s) AND x.execution_state = '{_ACTIVE}'"
)


def active_executions(work_unit_ids: Sequence[int]) -> dict[int, ExecutionRow]:
    """The ACTIVE execution of each work unit (by work unit id) as row records, in one statement."""
    if not work_unit_ids:
        return {}
    return {row[0]: _fill(ExecutionRow, row[1:]) for row in _fetch(_ACTIVE_EXECUTIONS_SQL, [list(work_unit_ids)],
                                                                     many=True)}
