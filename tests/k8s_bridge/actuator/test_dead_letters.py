"""Dead letters in the admin: the task decoded, and re-queued through a service."""
from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests import factories
from tests.k8s_bridge.actuator.test_handlers import run
from workunits import services
from workunits.models import DeadLetter, Operation, WorkUnitExecution

pytestmark = pytest.mark.django_db


def _dead_create(api_cluster: Any) -> tuple[int, DeadLetter]:
    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    run(create, change=lambda t: setattr(t, "target_eid", 0) or t.work_unit.Clear())  # no work unit: permanent
    return create, DeadLetter.objects.get(operation_id=create)


def test_it_shows_a_dead_letter_with_its_task_decoded(operator: Client, api_cluster: Any) -> None:
    create, dead = _dead_create(api_cluster)
    page = operator.get(f"/admin/workunits/deadletter/{dead.id}/change/").content.decode()
    assert "xmc.actuator.create" in page
    assert f"operations/{create}" in page  # the decoded task's operation name
    assert "INVALID_ARGUMENT" in page


def test_it_requeues_a_dead_stop_as_the_same_operation(operator: Client, api_cluster: Any, delivered: list[list[int]],
                                                       django_capture_on_commit_callbacks: Any) -> None:
    """A Delete's dead letter leaves STOPPING with an ERROR; the re-queue reopens that operation.

    (A dead Create fails its execution and comes back as a new one:
    test_failures_reach_people.py.)"""
    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    run(create)
    stop = services.stop_work_units(exp.id, [1], batch=False).id
    run(stop, change=lambda t: setattr(t, "operation_time_ns", 1))  # older than the JobSet: permanent
    dead = DeadLetter.objects.get(operation_id=stop)
    ex = WorkUnitExecution.objects.get(work_unit__experiment_id=exp.id, eid=1)
    assert ex.state == "STOPPING" and ex.system_message["severity"] == "ERROR"
    assert ex.system_message["userFacingText"].startswith("the cluster refused the deletion of the JobSet")
    with django_capture_on_commit_callbacks(execute=True):
        operator.post("/admin/workunits/deadletter/",
                      {"action": "requeue_dead_letters", "_selected_action": [dead.id]})
    op = Operation.objects.get(id=stop)
    assert not op.done and op.error is None and op.dispatched_time is None
    assert delivered[-1] == [stop]
    assert DeadLetter.objects.get(id=dead.id).requeued_time is not None
    run(stop)  # the re-sent task, built from the row, succeeds
    assert Operation.objects.get(id=stop).error is None


def test_it_refuses_to_requeue_a_dead_letter_without_an_operation(operator: Client) -> None:
    dead = services.record_dead_letter(task_name="xmc.actuator.create", task_type="CREATE", payload=b"junk",
                                       operation_id=None, error_code="INVALID_ARGUMENT", error_message="bad",
                                       attempts=1)
    response = operator.post("/admin/workunits/deadletter/",
                             {"action": "requeue_dead_letters", "_selected_action": [dead.id]}, follow=True)
    assert "nothing to send again" in response.content.decode()
    assert operator.get(f"/admin/workunits/deadletter/{dead.id}/change/").status_code == 200


def test_it_requeues_a_dead_letter_from_its_own_page(operator: Client, api_cluster: Any, delivered: list[list[int]],
                                                    django_capture_on_commit_callbacks: Any) -> None:
    create, dead = _dead_create(api_cluster)
    page = operator.get(f"/admin/workunits/deadletter/{dead.id}/change/").content.decode()
    action = f"/admin/workunits/deadletter/{dead.id}/requeue/"
    assert f'action="{action}"' in page and ">Re-queue</button>" in page
    assert operator.get(action).status_code == 405  # a button, not a link: nothing is sent by a GET
    with django_capture_on_commit_callbacks(execute=True):
        back = operator.post(action, follow=True)
    assert back.redirect_chain[-1][0] == f"/admin/workunits/deadletter/{dead.id}/change/"
    assert f"Re-queued dead letter {dead.id}." in back.content.decode()
    # The button does what the list's action does: a dead create comes back as a new execution's
    # Restart (tests/k8s_bridge/actuator/test_failures_reach_people.py), the create keeps its error.
    restart = Operation.objects.get(work_unit=Operation.objects.get(id=create).work_unit, task_type="RESTART")
    assert delivered[-1] == [restart.id]
    assert Operation.objects.get(id=create).done
    assert ">Re-queue again</button>" in back.content.decode()


def test_it_says_why_a_dead_letter_cannot_be_requeued_on_its_own_page(operator: Client) -> None:
    dead = services.record_dead_letter(task_name="xmc.actuator.create", task_type="CREATE", payload=b"junk",
                                       operation_id=None, error_code="INVALID_ARGUMENT", error_message="bad",
                                       attempts=1)
    back = operator.post(f"/admin/workunits/deadletter/{dead.id}/requeue/", follow=True)
    assert back.status_code == 200 and "nothing to send again" in back.content.decode()
    assert operator.post("/admin/workunits/deadletter/999999/requeue/").status_code == 404


def test_it_names_the_scheduling_switches_in_english(operator: Client) -> None:
    index = operator.get("/admin/").content.decode()
    assert "Scheduling switches" in index and "switchs" not in index
