"""The dead letter's state change against the writers that race it (issue 38, item 1).

Real Postgres, real threads: one writer is held inside its transaction
(after its write, before its commit) while the other queues behind the work
unit's row lock, then let go. The interleavings:

* a stop committed while the dead letter waited: STOPPING stays (the stop wins);
* a late success: the reconciler's RUNNING (from a JobSet the last try did
  create) and the late completion of the operation after the dead letter
  committed FAILED: both refused, FAILED stays, the error stays;
* a re-queue racing a stop: the re-queue's new execution N+1 commits first,
  the stop then stops N+1 (never the FAILED N), and the Restart task will be
  skipped; the stop first: the FAILED execution cannot be stopped, and the
  re-queue that follows brings the unit back.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from core.errors import FailedPrecondition
from tests import factories
from tests.workunits.test_stop_race import wait_for_a_lock_waiter
from workunits import services, state
from workunits.choices import WorkUnitState, Writer
from workunits.models import DeadLetter, Operation, WorkUnitExecution
from workunits.services import commands, failures
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db(transaction=True)

S = WorkUnitState
REFUSAL = services.Refusal("INTERNAL", "Kubernetes API 500 Internal Server Error", 9)


def dead_letter(op_id: int) -> None:
    services.dead_letter_operation(op_id, REFUSAL, task_name="xmc.actuator.create", task_type="CREATE", payload=b"")


def execution(xid: int, eid: int) -> WorkUnitExecution:
    return WorkUnitExecution.objects.get(work_unit__experiment_id=xid, eid=eid)


class Held:
    """Run ``body`` in a thread whose transaction stops at ``module.name`` (after it ran) until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any, name: str, body: Callable[[], Any]) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        original = getattr(module, name)

        def held(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.inside.set()
            assert self.release.wait(60)
            return result

        monkeypatch.setattr(module, name, held)
        self.thread = threading.Thread(target=self._run, args=(body,))

    def _run(self, body: Callable[[], Any]) -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.errors.append(exc)
        finally:
            connections.close_all()

    def __enter__(self) -> Held:
        self.thread.start()
        assert self.inside.wait(60), "the held writer never reached its write"
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.thread.join(60)

    def join(self) -> None:
        self.release.set()
        self.thread.join(60)
        if self.errors:
            raise self.errors[0]


def in_thread(body: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(body())
        except BaseException as exc:  # noqa: BLE001
            out.append(exc)
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_it_lets_a_stop_committed_while_the_dead_letter_waited_win(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    create = Operation.objects.get(work_unit=wu, task_type="CREATE").id
    stop = Held(monkeypatch, commands, "_apply_updates",
                lambda: services.stop_work_units(exp.id, [wu.wid], batch=False))
    with stop:
        t, out = in_thread(lambda: dead_letter(create))
        wait_for_a_lock_waiter()
    stop.join()
    t.join(60)
    assert not [o for o in out if isinstance(o, BaseException)]
    assert execution(exp.id, 1).state == S.STOPPING
    assert DeadLetter.objects.filter(operation_id=create).exists()
    assert Operation.objects.get(id=create).error is not None


def test_it_changes_nothing_on_a_late_success_after_the_dead_letter(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    create = Operation.objects.get(work_unit=wu, task_type="CREATE").id
    held = Held(monkeypatch, failures, "_publish", lambda: dead_letter(create))
    running = ExecutionUpdate(xid=exp.id, wid=wu.wid, eid=1, mask=(state.STATE,), state=S.RUNNING,
                              state_update_time_ns=time.time_ns() + 10**9, writer=Writer.RECONCILER)
    with held:  # FAILED written, not yet committed
        t, out = in_thread(lambda: services.update_work_unit_executions([running]))
        wait_for_a_lock_waiter()
    held.join()
    t.join(60)
    assert out == [[]]  # the reconciler's RUNNING: no transition
    assert not services.complete_operation(create)  # the create's late success: already done
    ex = execution(exp.id, 1)
    assert ex.state == S.FAILED
    assert list(ex.history.values_list("to_state", flat=True).order_by("id")) == [S.INITIALIZING, S.FAILED]
    assert Operation.objects.get(id=create).error["message"] == REFUSAL.message


def test_it_stops_the_new_execution_of_a_requeue_racing_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    create = Operation.objects.get(work_unit=wu, task_type="CREATE").id
    dead_letter(create)
    letter = DeadLetter.objects.get(operation_id=create)
    requeue = Held(monkeypatch, commands, "_restart_locked", lambda: services.requeue_dead_letter(letter.id))
    with requeue:
        t, out = in_thread(lambda: services.stop_work_units(exp.id, [wu.wid], batch=False))
        wait_for_a_lock_waiter()
    requeue.join()
    t.join(60)
    (stop,) = out
    assert isinstance(stop, Operation) and stop.target_eid == 2
    assert execution(exp.id, 1).state == S.FAILED
    assert execution(exp.id, 2).state == S.STOPPING
    restart = Operation.objects.get(work_unit=wu, task_type="RESTART")
    assert not restart.done  # its task will find STOPPING and skip (preconditions.execution_skip_reason)


def test_it_refuses_a_stop_before_the_requeue_and_the_requeue_still_brings_it_back() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    create = Operation.objects.get(work_unit=wu, task_type="CREATE").id
    dead_letter(create)
    with pytest.raises(FailedPrecondition, match="already FAILED"):
        services.stop_work_units(exp.id, [wu.wid], batch=False)
    services.requeue_dead_letter(DeadLetter.objects.get(operation_id=create).id)
    assert execution(exp.id, 2).state == S.RESTARTING
