"""The actuator's preconditions as pure functions (STATES.md "Actuator preconditions").

No I/O here: the handlers read the execution row and the JobSet and pass
plain values; each function returns a decision or raises
``k8s_bridge.errors.ActuatorError`` with a permanent code.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobsets.contract import identity
from k8s_bridge.errors import ActuatorError
from workunits.choices import TERMINAL, WorkUnitState


class Decision(str, enum.Enum):
    ACT = "act"                  # touch the cluster
    DONE = "done"                # nothing to do: complete the operation
    SUPERSEDED = "superseded"    # a newer execution owns the JobSet: complete without action
    WAIT = "wait"                # a deletion is in progress: retry later


@dataclass(frozen=True)
class ExecutionView:
    """What a handler read about the execution a task is for."""

    current_eid: int
    state: str


def execution_skip_reason(view: ExecutionView | None, eid: int) -> str | None:
    """Create/Restart: why the task must complete without touching the cluster (None: go on)."""
    if view is None:
        return "the work unit no longer exists"
    if view.current_eid != eid:
        return f"execution {eid} is no longer current (current is {view.current_eid})"
    if view.state == WorkUnitState.STOPPING or view.state in TERMINAL:
        return f"execution {eid} is already {view.state}"
    return None


def verify_duplicate_jobset(existing: Mapping[str, Any], xid: int, wid: int, eid: int) -> None:
    """Create hit AlreadyExists: success when the object is ours for this very execution.

    A JobSet with the same name but other xid/wid/eid labels (a foreign object,
    or another execution's) is FailedPrecondition.
    """
    got = identity(dict(existing))[:3]
    if got != (xid, wid, eid):
        name = (existing.get("metadata") or {}).get("name", "?")
        raise ActuatorError(
            "FAILED_PRECONDITION",
            f"JobSet {name} already exists and is not execution {xid}/{wid}/{eid} "
            f"(labels say xid={got[0]} wid={got[1]} eid={got[2]})",
        )


def removal_decision(jobset: Mapping[str, Any] | None, target_eid: int, operation_time_ns: int) -> Decision:
    """Delete and the first half of Restart: may this task remove ``jobset``?

    NotFound -> DONE; ``k8s_eid > target_eid`` -> SUPERSEDED; an operation time
    older than the JobSet's last-edit label -> FailedPrecondition (a newer
    decision wrote it); a deletion already under way -> WAIT; else ACT.
    """
    if jobset is None:
        return Decision.DONE
    _, _, k8s_eid, last_edit = identity(dict(jobset))
    if k8s_eid is not None and k8s_eid > target_eid:
        return Decision.SUPERSEDED
    if last_edit is not None and operation_time_ns < last_edit:
        raise ActuatorError(
            "FAILED_PRECONDITION",
            f"stale task: operation time {operation_time_ns} predates the JobSet's last edit {last_edit}",
        )
    if (jobset.get("metadata") or {}).get("deletionTimestamp"):
        return Decision.WAIT
    return Decision.ACT


def restart_decision(jobset: Mapping[str, Any] | None, eid: int, target_eid: int, operation_time_ns: int) -> Decision:
    """Restart of ``target_eid`` into ``eid``: DONE when the new JobSet already exists
    (redelivered Restart), ACT = create it (nothing left in the way), WAIT = the old
    one is still there or going away (delete it first / retry later)."""
    if jobset is None:
        return Decision.ACT
    _, _, k8s_eid, _ = identity(dict(jobset))
    if k8s_eid is not None and k8s_eid >= eid:
        return Decision.DONE
    removal = removal_decision(jobset, target_eid, operation_time_ns)
    if removal == Decision.SUPERSEDED:  # target < k8s_eid < eid: cannot happen with whole eids
        return Decision.DONE
    return Decision.WAIT


def validate_update_mask(paths: list[str], known: frozenset[str]) -> None:
    unknown = [p for p in paths if p not in known]
    if not paths or unknown:
        raise ActuatorError("INVALID_ARGUMENT", f"update mask {paths!r}: supported paths are {sorted(known)}")


def identity_matches(jobset: Mapping[str, Any], xid: int, wid: int, eid: int) -> bool:
    return identity(dict(jobset))[:3] == (xid, wid, eid)
