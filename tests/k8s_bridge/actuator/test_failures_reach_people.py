"""Every retry and every dead letter of the actuator changes what the researcher sees (issue 38, item 1).

Tasks run in-process (``Task.apply``: a Celery retry runs again at once),
against the API-only simulator with its fault rules. The researcher, Rosa,
launches a work unit the cluster keeps refusing; Olivia, an operator,
re-queues it from the admin.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import time

import pytest
from django.test import Client

from core.hooks import Hooks
from tests import factories
from tests.k8s_bridge.actuator.conftest import get_jobset
from tests.k8s_bridge.actuator.test_handlers import run
from k8s_bridge.reconciler import sweep
from workunits import hooks, services
from workunits.state import STATE, ExecutionUpdate
from workunits.models import DeadLetter, Operation, StatusMessage, WorkUnitExecution

pytestmark = pytest.mark.django_db


@pytest.fixture
def refusing(api_cluster: Any, settings: Any) -> Iterator[Any]:
    """The cluster answers 500 to every JobSet create; three tries, no waiting."""
    settings.XMC_ACTUATOR_MAX_RETRIES = 2
    settings.XMC_ACTUATOR_BACKOFF_BASE_S = 0.01
    settings.XMC_ACTUATOR_BACKOFF_MAX_S = 0.01
    api_cluster.faults.clear()
    api_cluster.faults.set({"rules": [{"action": "error", "verb": "create", "resource": "jobsets", "status": 500}]})
    yield api_cluster
    api_cluster.faults.clear()


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The transitions handed to the pages and notifications after commit."""
    seen: list[Any] = []
    listeners: Hooks[[Sequence[Any]]] = Hooks("test.committed_hook_failed")
    listeners.register(lambda ts: seen.extend(ts))
    monkeypatch.setattr(hooks, "committed_hooks", listeners)
    return seen


def execution(xid: int, eid: int = 1) -> WorkUnitExecution:
    return WorkUnitExecution.objects.get(work_unit__experiment_id=xid, work_unit__wid=1, eid=eid)


def launch() -> tuple[int, int]:
    exp = factories.experiment(creator="rosa@example.com")
    return exp.id, services.create_work_unit(exp.id, factories.work_unit_message()).id


def test_it_warns_while_the_cluster_refuses_the_create(refusing: Any, django_capture_on_commit_callbacks: Any,
                                                        heard: list[Any]) -> None:
    xid, create = launch()
    with django_capture_on_commit_callbacks(execute=True):
        run(create)
    warnings = [m.content["userFacingText"] for m in StatusMessage.objects.filter(
        experiment_id=xid, severity="WARNING").order_by("id")]
    assert len(warnings) == 2  # one per retry
    assert warnings[0].startswith("the cluster refused the JobSet once: Kubernetes API 500")
    assert warnings[1].startswith("the cluster refused the JobSet twice: Kubernetes API 500")
    assert "; retrying in " in warnings[1] and warnings[1].endswith(" s")
    # Each warning reached the pages while the unit still waited (a same-state event).
    assert [(t.old_state, t.new_state) for t in heard[:2]] == [("INITIALIZING", "INITIALIZING")] * 2


def test_it_fails_the_execution_in_the_dead_letters_transaction(refusing: Any, heard: list[Any],
                                                                 django_capture_on_commit_callbacks: Any) -> None:
    xid, create = launch()
    with django_capture_on_commit_callbacks(execute=True):
        run(create)
    op = Operation.objects.get(id=create)
    letter = DeadLetter.objects.get(operation_id=create)
    ex = execution(xid)
    assert op.done and op.error["code"] == 13  # INTERNAL, from the 500
    assert letter.attempts == 3
    assert ex.state == "FAILED" and ex.complete_time is not None
    assert ex.system_message["severity"] == "ERROR"
    text = ex.system_message["userFacingText"]
    assert text.startswith("the cluster refused the JobSet 3 times over ")
    assert "Kubernetes API 500" in text and text.endswith("an operator can re-queue it")
    assert ("INITIALIZING", "FAILED") in [(t.old_state, t.new_state) for t in heard]
    history = list(ex.history.order_by("id").values_list("to_state", "writer", "operation_id"))
    assert history[-1] == ("FAILED", "actuator", create)
    assert ex.work_unit.experiment.child_state_counts == {"FAILED": 1}


def test_it_says_a_permanent_refusal_will_not_be_retried(api_cluster: Any) -> None:
    xid, create = launch()
    run(create, change=lambda t: t.work_unit.Clear())  # a task the actuator can never carry out
    ex = execution(xid)
    assert ex.state == "FAILED"
    assert DeadLetter.objects.get(operation_id=create).attempts == 1
    assert ex.system_message["userFacingText"].endswith("will not be retried: correct the job and launch it again")


def test_it_lets_a_stop_that_came_first_win_over_the_dead_letter(refusing: Any) -> None:
    xid, create = launch()
    services.stop_work_units(xid, [1], batch=False)
    # The create's last try was already past its re-read when the stop committed.
    services.dead_letter_operation(create, services.Refusal("INTERNAL", "Kubernetes API 500", 9),
                                   task_name="xmc.actuator.create", task_type="CREATE", payload=b"")
    assert execution(xid).state == "STOPPING"
    assert Operation.objects.get(id=create).error is not None


def test_it_does_not_adopt_a_late_jobset_after_the_dead_letter(refusing: Any) -> None:
    """The last create reached the cluster though its answer was lost: the record says FAILED and stays so."""
    xid, create = launch()
    run(create)
    assert execution(xid).state == "FAILED"
    refusing.faults.clear()
    # A copy of the task the sweep re-sent before the dead letter finds its operation done: nothing happens.
    run(create)
    assert get_jobset(refusing, xid, 1) is None
    # The create that "failed" had in fact been made: the reconciler's observation cannot revive the execution...
    services.update_work_unit_executions([ExecutionUpdate(xid=xid, wid=1, eid=1, mask=(STATE,), state="RUNNING",
                                                          state_update_time_ns=time.time_ns() + 10**9)])
    assert execution(xid).state == "FAILED"
    # ...and the orphan sweep removes the JobSet nobody will watch.
    snap = sweep.snapshot("default")
    jobset = {"metadata": {"name": f"xmc-{xid}-1", "namespace": "default", "uid": "u-1",
                           "labels": {"xmc.google.com/xid": str(xid), "xmc.google.com/wid": "1",
                                      "xmc.google.com/execution-id": "1"}}}
    repairs = sweep.plan(snap, [jobset], ["default"])
    assert [(r.case, r.jobset) for r in repairs] == [
        ("jobset_of_dead_lettered_execution", ("default", f"xmc-{xid}-1", "u-1"))]


def test_it_brings_the_work_unit_back_as_a_new_execution_on_a_requeue(
        refusing: Any, operator: Client, django_capture_on_commit_callbacks: Any, delivered: list[list[int]]) -> None:
    xid, create = launch()
    run(create)
    letter = DeadLetter.objects.get(operation_id=create)
    refusing.faults.clear()  # the cluster is healthy again
    with django_capture_on_commit_callbacks(execute=True):
        operator.post("/admin/workunits/deadletter/", {"action": "requeue_dead_letters", "_selected_action": [letter.id]})
    failed, again = execution(xid, 1), execution(xid, 2)
    assert failed.state == "FAILED" and failed.execution_state == "INACTIVE"
    assert again.state == "RESTARTING" and again.execution_state == "ACTIVE"
    restart = Operation.objects.get(work_unit=failed.work_unit, task_type="RESTART")
    assert (restart.eid, restart.target_eid, restart.original_requester) == (2, 1, "olivia@example.com")
    assert delivered[-1] == [restart.id]
    assert Operation.objects.get(id=create).error is not None  # the record of what happened stays
    assert DeadLetter.objects.get(id=letter.id).requeued_time is not None
    run(restart.id)
    assert get_jobset(refusing, xid, 1)["metadata"]["labels"]["xmc.google.com/execution-id"] == "2"


def test_it_refuses_a_requeue_after_the_person_restarted(refusing: Any) -> None:
    xid, create = launch()
    run(create)
    services.restart_work_units(xid, [1], batch=False)  # Rosa restarted it herself
    letter = DeadLetter.objects.get(operation_id=create)
    with pytest.raises(Exception, match="has moved on since this dead letter"):
        services.requeue_dead_letter(letter.id)
    assert execution(xid, 2).state == "RESTARTING"
    assert not WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, eid=3).exists()
