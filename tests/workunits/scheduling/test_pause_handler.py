"""The actuator's pause handler: what it holds, what it writes, and the gate against a concurrent pause."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from core.errors import Aborted
from core.protos import task_pb2
from k8s_bridge.actuator.pause import hold_if_paused, release
from tests import factories
from tests.workunits.scheduling.conftest import OLIVIA, task_for
from workunits import scheduling, services
from workunits.models import PausedTask, StatusHistory, StatusMessage, WorkUnitExecution


def current(wu) -> WorkUnitExecution:
    wu.refresh_from_db()
    return WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid)


@pytest.mark.django_db
class TestWhilePaused:
    @pytest.fixture(autouse=True)
    def _paused(self) -> None:
        scheduling.pause(reason="cluster upgrade", by=OLIVIA)

    def test_it_holds_a_create_and_moves_the_execution_to_scheduling_paused(self) -> None:
        wu = factories.work_unit(factories.experiment())
        task = task_for(wu, "CREATE")
        assert hold_if_paused(task) is True
        row = PausedTask.objects.get()
        assert (row.task_type, row.xid, row.wid, row.eid) == ("CREATE", wu.experiment_id, wu.wid, 1)
        assert row.created_time is not None and row.processed_time is None
        assert task_pb2.Task.FromString(bytes(row.payload)) == task
        ex = current(wu)
        assert ex.state == "SCHEDULING_PAUSED"
        assert ex.system_message["severity"] == "INFO"
        assert "cluster upgrade" in ex.system_message["userFacingText"]
        history = StatusHistory.objects.filter(execution=ex).latest("id")
        assert (history.from_state, history.to_state, history.writer) == (
            "INITIALIZING", "SCHEDULING_PAUSED", "pause_handler")
        assert history.extra["mask"] == ["status.state", "status.system_message"]
        assert StatusMessage.objects.filter(work_unit=wu, severity="INFO").count() == 1
        assert not scheduling.holds_gate()  # a held task leaves the gate at once

    def test_it_holds_a_restart_on_the_new_execution(self) -> None:
        exp = factories.experiment()
        wu = factories.work_unit(exp)
        services.restart_work_units(exp.id, [wu.wid], batch=False)
        assert hold_if_paused(task_for(wu, "RESTART")) is True
        assert PausedTask.objects.get().eid == 2
        assert current(wu).state == "SCHEDULING_PAUSED"

    def test_it_holds_an_update_without_touching_the_execution(self) -> None:
        wu = factories.work_unit(factories.experiment())
        before = current(wu)
        assert hold_if_paused(task_for(wu, "UPDATE")) is True
        assert PausedTask.objects.get().task_type == "UPDATE"
        after = current(wu)
        assert (after.state, after.system_message) == (before.state, before.system_message)

    def test_it_never_holds_a_delete(self) -> None:
        wu = factories.work_unit(factories.experiment())
        assert hold_if_paused(task_for(wu, "DELETE")) is False
        assert PausedTask.objects.count() == 0
        assert not scheduling.holds_gate()

    def test_it_stores_a_redelivered_task_once(self) -> None:
        wu = factories.work_unit(factories.experiment())
        task = task_for(wu, "CREATE")
        again = task_pb2.Task()
        again.CopyFrom(task)
        assert hold_if_paused(task) and hold_if_paused(again)
        assert PausedTask.objects.count() == 1
        assert StatusMessage.objects.filter(work_unit=wu, severity="INFO").count() == 1

    def test_it_stores_a_create_whose_work_unit_is_already_stopping_without_pausing_it(self) -> None:
        exp = factories.experiment()
        wu = factories.work_unit(exp)
        services.stop_work_units(exp.id, [wu.wid], batch=False)
        assert hold_if_paused(task_for(wu, "CREATE")) is True
        assert current(wu).state == "STOPPING"  # SCHEDULING_PAUSED only from INITIALIZING/RESTARTING
        assert PausedTask.objects.count() == 1  # resumption skips it (work_unit_stopping)

    def test_it_stops_a_paused_work_unit_straight_to_stopped(self) -> None:
        exp = factories.experiment()
        wu = factories.work_unit(exp)
        hold_if_paused(task_for(wu, "CREATE"))
        services.stop_work_units(exp.id, [wu.wid], batch=False)
        assert current(wu).state == "STOPPED"


@pytest.mark.django_db
def test_it_lets_tasks_through_while_running_and_keeps_the_gate_until_the_task_ends() -> None:
    wu = factories.work_unit(factories.experiment())
    assert hold_if_paused(task_for(wu, "CREATE")) is False
    assert scheduling.holds_gate()
    assert PausedTask.objects.count() == 0
    assert current(wu).state == "INITIALIZING"
    release()
    assert not scheduling.holds_gate()


# --- The race with a pause committed while tasks are in flight (real Postgres, threads) ---


def _in_thread(fn):
    """Run ``fn`` in a thread with its own database connection; returns (thread, result box)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc
        finally:
            release()
            connection.close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


@pytest.mark.django_db(transaction=True)
def test_it_makes_a_pause_wait_until_a_task_in_flight_has_left_the_cluster() -> None:
    wu = factories.work_unit(factories.experiment())
    task = task_for(wu, "CREATE")
    passed, finish = threading.Event(), threading.Event()
    cluster_calls: list[float] = []

    def actuator() -> bool:
        held = hold_if_paused(task)
        passed.set()
        finish.wait(30)
        if not held:
            time.sleep(0.2)
            cluster_calls.append(time.monotonic())  # the JobSet create
        return held

    worker, worker_box = _in_thread(actuator)
    assert passed.wait(30)
    pauser, pause_box = _in_thread(lambda: (scheduling.pause(reason="quota", by=OLIVIA), time.monotonic()))
    time.sleep(0.5)
    assert pauser.is_alive(), "the pause must wait for the task that passed the gate"
    assert not scheduling.is_paused()
    finish.set()
    worker.join(30)
    pauser.join(30)
    assert "error" not in pause_box and "error" not in worker_box
    _, committed_at = pause_box["value"]
    assert worker_box["value"] is False and cluster_calls and cluster_calls[0] < committed_at
    # After the pause returned, the next task is held.
    assert hold_if_paused(task_for(wu, "UPDATE")) is True


@pytest.mark.django_db(transaction=True)
def test_it_lets_no_task_but_deletes_reach_the_cluster_after_the_pause_commits() -> None:
    exp = factories.experiment()
    work_units = [factories.work_unit(exp) for _ in range(6)]
    kinds = ["CREATE", "UPDATE", "DELETE"]
    tasks = [task_for(wu, kinds[i % 3]) for i, wu in enumerate(work_units * 3)]
    touched: list[tuple[str, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def actuator(batch: list[task_pb2.Task]) -> None:
        start.wait(30)
        for task in batch:
            if task.type == task_pb2.Task.DELETE or not hold_if_paused(task):
                time.sleep(0.01)  # talking to the cluster
                with lock:
                    touched.append((task_pb2.Task.Type.Name(task.type), time.monotonic()))
            release()  # the task ends

    workers = [_in_thread(lambda b=tasks[i::3]: actuator(b)) for i in range(3)]

    def pause_soon() -> float:
        start.wait(30)
        time.sleep(0.05)
        scheduling.pause(reason="incident", by=OLIVIA)
        return time.monotonic()

    pauser, box = _in_thread(pause_soon)
    for thread, _ in [*workers, (pauser, box)]:
        thread.join(60)
    committed_at = box["value"]
    late = [kind for kind, at in touched if at > committed_at]
    assert set(late) <= {"DELETE"}
    held = PausedTask.objects.count()
    assert held + sum(1 for kind, _ in touched if kind != "DELETE") == 12  # every held-type task went one way


@pytest.mark.django_db(transaction=True)
def test_it_fails_a_pause_that_cannot_drain_and_changes_nothing(settings) -> None:
    settings.XMC_PAUSE_DRAIN_TIMEOUT_S = 0.3
    wu = factories.work_unit(factories.experiment())
    passed, finish = threading.Event(), threading.Event()

    def stuck_actuator() -> bool:
        held = hold_if_paused(task_for(wu, "CREATE"))
        passed.set()
        finish.wait(30)
        return held

    worker, _ = _in_thread(stuck_actuator)
    assert passed.wait(30)
    try:
        with pytest.raises(Aborted, match="still in flight"):
            scheduling.pause(reason="quota", by=OLIVIA)
        assert not scheduling.is_paused()
        assert scheduling.get_status().changed_by == ""
    finally:
        finish.set()
        worker.join(30)


@pytest.mark.django_db
def test_it_releases_the_gate_when_the_celery_task_ends() -> None:
    from celery.signals import task_postrun

    wu = factories.work_unit(factories.experiment())
    assert hold_if_paused(task_for(wu, "CREATE")) is False and scheduling.holds_gate()
    task_postrun.send(sender=None, task_id="t1", task=None, args=(), kwargs={}, retval=None, state="SUCCESS")
    assert not scheduling.holds_gate()
