"""Failing work units through the service write path, published as the reconciler does after commit;
workers racing over the same rows."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from django.db import connection

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


def race(work: Callable[[list[int]], object], orders: Sequence[list[int]]) -> list[BaseException]:
    """Run ``work`` on each order in its own thread (own connection), all starting at once; the errors."""
    start, errors = threading.Barrier(len(orders)), []

    def worker(order: list[int]) -> None:
        try:
            start.wait()
            work(order)
        except Exception as exc:  # the caller asserts there were none
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(o,)) for o in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
