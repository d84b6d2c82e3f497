"""Failing work units through the service write path, published as the reconciler does after commit."""
from __future__ import annotations

import time
from collections.abc import Sequence

from workunits import hooks
from workunits import services as wu_services
from workunits import state as guards
from workunits.choices import WorkUnitState
from workunits.models import WorkUnit


def set_state(units: Sequence[WorkUnit], state: str = WorkUnitState.FAILED) -> list[object]:
    """One guarded write of ``state`` to the current execution of each unit, then the after-commit hook."""
    now = time.time_ns()
    updates = [guards.ExecutionUpdate(xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid,
                                      mask=("status.state",), state=state, state_update_time_ns=now + i)
               for i, wu in enumerate(units)]
    transitions = wu_services.update_work_unit_executions(updates)
    hooks.on_transitions_committed(transitions)
    return list(transitions)


def fail(*units: WorkUnit) -> list[object]:
    return set_state(units, WorkUnitState.FAILED)
