"""The orphan sweep: the level-triggered backstop run on every full resync (STATES.md).

Events can be lost (someone deletes a JobSet and strips the finalizer, a
worker dies between two writes, the broker loses a task). On each full
resync the controller takes a :func:`snapshot` of the current executions
*before* it lists the JobSets (so an execution whose JobSet was created after
the list is seen with its create operation still pending and left alone),
then :func:`plan` compares the two and returns the repairs:

* ``STOPPING`` and no JobSet -> ``STOPPED``;
* another non-terminal execution whose JobSet vanished without passing our
  finalizer path -> ``FAILED`` with an ERROR message saying so;
* ``INITIALIZING`` / ``RESTARTING`` whose create (restart) operation is done
  and yet no JobSet exists -> ``FAILED`` with the operation's error;
* a JobSet of ours whose execution is archived (older eid), whose work unit
  does not exist, or whose execution the dead letter of its create (restart)
  operation turned ``FAILED`` (the last try reached the cluster though its
  answer was lost) -> the JobSet is deleted (UID precondition); its finalizer
  path then finds the write fenced or the work unit missing and lets it go.

The snapshot read before the list is right for everything the list can miss
(an execution without JobSet) and for an archived execution (a current eid
only grows), but not for a work unit the snapshot did not see: one created
after the snapshot can have its JobSet in the list, the more likely the
longer the list takes (a stalled API server). :func:`recheck` therefore reads
those work units again *after* the list and drops the deletion of any that
exists by then; a work unit row always commits before its JobSet is created.

An execution (or work unit) with a create or restart operation still pending
is never touched, and ``SCHEDULING_PAUSED`` has no JobSet by design. Every
write goes through the guarded ``update_work_unit_executions``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from core.keys import ExecutionKey
from k8s_bridge.reconciler.mapping import execution_key
from workunits.choices import TERMINAL, ExecutionState, TaskType, WorkUnitState
from workunits.models import Operation, WorkUnit, WorkUnitExecution

S = WorkUnitState


@dataclass(frozen=True)
class Candidate:
    """A current execution as the database saw it before the list."""

    key: ExecutionKey
    state: str
    namespace: str
    #: a create/restart operation for this execution is not done yet
    pending: bool
    #: the error of its done create/restart operation, if any
    operation_error: str = ""
    #: the stored state's time (a repair is never older)
    state_update_time_ns: int = 0


@dataclass(frozen=True)
class Snapshot:
    executions: dict[tuple[int, int], Candidate]
    #: (xid, wid) -> current eid, for every work unit that exists
    current_eids: dict[tuple[int, int], int]
    #: work units with any create/restart operation still pending
    busy: frozenset[tuple[int, int]]


@dataclass(frozen=True)
class Repair:
    case: str
    key: ExecutionKey
    state: str = ""
    message: str = ""
    #: the stored state's time of the execution repaired (0: unknown)
    state_update_time_ns: int = 0
    #: for a JobSet to delete: (namespace, name, uid)
    jobset: tuple[str, str, str] | None = None


def snapshot(default_namespace: str) -> Snapshot:
    """Read the current executions (and pending operations) as of one point in time.

    The reads are one ``REPEATABLE READ`` transaction: a work unit committed
    while they run is seen whole (execution, pending create, current eid) or
    not at all. Under the default READ COMMITTED each query has its own
    snapshot, and an execution seen by one whose pending create the other
    missed would be repaired as "created without JobSet".
    """
    connection = transaction.get_connection()
    # Only a transaction of our own can be made REPEATABLE READ (a test's may already be open).
    own = connection.vendor == "postgresql" and not connection.in_atomic_block
    with transaction.atomic():
        if own:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return _read_snapshot(default_namespace)


def _read_snapshot(default_namespace: str) -> Snapshot:
    rows = list(
        WorkUnitExecution.objects.filter(execution_state=ExecutionState.ACTIVE)
        .values_list("work_unit__experiment_id", "work_unit__wid", "eid", "state", "metadata", "state_update_time_ns")
    )
    pending_ops = Operation.objects.filter(
        done=False, task_type__in=(TaskType.CREATE, TaskType.RESTART), work_unit__isnull=False
    ).values_list("work_unit__experiment_id", "work_unit__wid", "eid")
    pending = {(x, w, e) for x, w, e in pending_ops}
    busy = frozenset((x, w) for x, w, _ in pending)
    executions: dict[tuple[int, int], Candidate] = {}
    need_error: list[tuple[int, int, int]] = []
    for xid, wid, eid, state, metadata, time_ns in rows:
        namespace = str((metadata or {}).get("namespace") or default_namespace)
        executions[(xid, wid)] = Candidate(ExecutionKey(xid, wid, eid), state, namespace, (xid, wid, eid) in pending,
                                           state_update_time_ns=int(time_ns or 0))
        if state in (S.INITIALIZING, S.RESTARTING, S.FAILED):
            need_error.append((xid, wid, eid))
    if need_error:
        done = Operation.objects.filter(
            done=True, error__isnull=False, task_type__in=(TaskType.CREATE, TaskType.RESTART),
            work_unit__experiment_id__in={x for x, _, _ in need_error},
        ).values_list("work_unit__experiment_id", "work_unit__wid", "eid", "error")
        wanted = set(need_error)
        for oxid, owid, oeid, error in done:
            if (oxid, owid, oeid) in wanted and error:
                c = executions[(oxid, owid)]
                executions[(oxid, owid)] = Candidate(c.key, c.state, c.namespace, c.pending, _error_text(error),
                                                     c.state_update_time_ns)
    current = dict(
        ((x, w), e) for x, w, e in WorkUnit.objects.values_list("experiment_id", "wid", "current_eid")
    )
    return Snapshot(executions, current, busy)


def recheck(repairs: Iterable[Repair]) -> list[Repair]:
    """``repairs`` without the deletions of JobSets whose work unit exists now (read after the list)."""
    repairs = list(repairs)
    unseen = {(r.key.xid, r.key.wid) for r in repairs if r.case == "jobset_without_work_unit"}
    if not unseen:
        return repairs
    exists = set(
        WorkUnit.objects.filter(experiment_id__in={x for x, _ in unseen}, wid__in={w for _, w in unseen})
        .values_list("experiment_id", "wid")
    )
    return [r for r in repairs if r.case != "jobset_without_work_unit" or (r.key.xid, r.key.wid) not in exists]


def _error_text(error: Any) -> str:
    if isinstance(error, Mapping):
        return str(error.get("message") or error)
    return str(error)


def plan(snap: Snapshot, jobsets: Iterable[Mapping[str, Any]], namespaces: Iterable[str]) -> list[Repair]:
    """The repairs for ``namespaces`` given the JobSets listed there (pure)."""
    watched = set(namespaces)
    present: set[ExecutionKey] = set()
    repairs: list[Repair] = []
    for js in jobsets:
        key = execution_key(js)
        if key is None:
            continue
        md = js.get("metadata") or {}
        present.add(key)
        wu_key = (key.xid, key.wid)
        if md.get("deletionTimestamp") or wu_key in snap.busy:
            continue  # already going away, or the actuator is still working on it
        ref = (str(md.get("namespace", "")), str(md.get("name", "")), str(md.get("uid", "")))
        current = snap.current_eids.get(wu_key)
        if current is None:
            repairs.append(Repair("jobset_without_work_unit", key, jobset=ref))
        elif key.eid < current:
            repairs.append(Repair("jobset_of_archived_execution", key, jobset=ref))
        else:
            c = snap.executions.get(wu_key)
            if c is not None and c.key == key and c.state == S.FAILED and c.operation_error:
                # Its create was dead-lettered (the execution FAILED with it), yet the last try had
                # reached the cluster: nothing will ever watch this JobSet for the record.
                repairs.append(Repair("jobset_of_dead_lettered_execution", key, jobset=ref))
    for wu_key, c in sorted(snap.executions.items()):
        if c.namespace not in watched or c.pending or wu_key in snap.busy or c.key in present:
            continue
        if c.state in TERMINAL or c.state == S.SCHEDULING_PAUSED:
            continue
        if c.state == S.STOPPING:
            repairs.append(Repair("stopping_without_jobset", c.key, S.STOPPED,
                                  state_update_time_ns=c.state_update_time_ns))
        elif c.state in (S.INITIALIZING, S.RESTARTING):
            why = f": {c.operation_error}" if c.operation_error else ""
            op = "restart" if c.state == S.RESTARTING else "create"
            repairs.append(Repair("created_without_jobset", c.key, S.FAILED,
                                  f"The {op} operation finished but no JobSet exists{why}",
                                  state_update_time_ns=c.state_update_time_ns))
        else:
            repairs.append(Repair(
                "jobset_vanished", c.key, S.FAILED,
                f"The JobSet of this execution disappeared without passing the XMC finalizer (last state {c.state});"
                " it was deleted outside XMC with its finalizer removed",
                state_update_time_ns=c.state_update_time_ns,
            ))
    return repairs
