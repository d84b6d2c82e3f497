"""The operators' ways in: the switch service, the commands, the admin actions, the staff-only REST endpoints."""
from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from core.errors import InvalidArgument
from k8s_bridge.actuator.pause import hold_if_paused, release
from tests import factories
from tests.api.rest.conftest import Api
from tests.workunits.scheduling.conftest import OLIVIA, actuator_messages, queue_messages, task_for
from workunits import scheduling
from workunits.models import PausedTask, SchedulingSwitch, SchedulingSwitchChange

pytestmark = pytest.mark.django_db


def held(n: int) -> None:
    exp = factories.experiment()
    for _ in range(n):
        assert hold_if_paused(task_for(factories.work_unit(exp), "CREATE"))
        release()


# --- The switch -------------------------------------------------------------------------


def test_it_records_every_change_of_the_switch() -> None:
    scheduling.pause(reason="cluster upgrade", by=OLIVIA)
    scheduling.pause(reason="again", by="bob@example.com")  # already paused: no change
    status = scheduling.get_status()
    assert (status.paused, status.changed_by, status.reason) == (True, OLIVIA, "cluster upgrade")
    result = scheduling.resume(by="bob@example.com", dispatch=False)
    assert result.was_paused and not scheduling.is_paused()
    history = list(SchedulingSwitchChange.objects.order_by("id").values_list("paused", "changed_by", "reason",
                                                                              "resumption_run_id"))
    assert history == [(True, OLIVIA, "cluster upgrade", None), (False, "bob@example.com", "", result.run_id)]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"reason": "  ", "by": OLIVIA}, "reason"),
    ({"reason": "x" * 1001, "by": OLIVIA}, "reason"),
    ({"reason": "ok", "by": ""}, "by"),
])
def test_it_refuses_a_pause_without_a_reason_or_an_operator(kwargs, field) -> None:
    with pytest.raises(InvalidArgument) as info:
        scheduling.pause(**kwargs)
    assert info.value.field == field
    assert not SchedulingSwitch.objects.filter(paused=True).exists()
    assert not SchedulingSwitchChange.objects.exists()


@pytest.mark.parametrize("batch_size", [0, -1, 10_001, "5", True])
def test_it_refuses_a_bad_batch_size(batch_size) -> None:
    scheduling.pause(reason="r", by=OLIVIA)
    with pytest.raises(InvalidArgument) as info:
        scheduling.resume(by=OLIVIA, batch_size=batch_size)
    assert info.value.field == "batch_size"
    assert scheduling.is_paused()


# --- Commands ---------------------------------------------------------------------------


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_it_pauses_reports_and_resumes_from_the_command_line(broker) -> None:
    assert "scheduling: running" in run("scheduling_status")
    out = run("pause_scheduling", "--reason", "quota incident", "--by", OLIVIA)
    assert "scheduling paused" in out
    held(3)
    status = run("scheduling_status")
    assert "scheduling: PAUSED" in status and f"paused by: {OLIVIA}" in status
    assert "reason: quota incident" in status and "pending paused tasks: 3" in status
    assert "already paused" in run("pause_scheduling", "--reason", "again")
    out = run("resume_scheduling", "--batch-size", "2", "--by", OLIVIA)
    assert "scheduling resumed" in out
    assert "3/3 rows" in out  # the progress bar reached the end
    assert "resumed: 3" in out and "skipped: 0" in out
    assert len(actuator_messages(broker)) == 3
    assert "pending paused tasks: 0" in run("scheduling_status")


def test_it_summarizes_skips_by_reason(broker) -> None:
    run("pause_scheduling", "--reason", "upgrade")
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    assert hold_if_paused(task_for(wu, "CREATE"))
    release()
    from workunits import services
    services.stop_work_units(exp.id, [wu.wid], batch=False)
    out = run("resume_scheduling")
    assert "resumed: 0" in out and "skipped: 1" in out and "work_unit_stopped: 1" in out


def test_it_hands_the_run_to_the_queue_with_background(broker, django_capture_on_commit_callbacks) -> None:
    run("pause_scheduling", "--reason", "upgrade")
    with django_capture_on_commit_callbacks(execute=True):
        out = run("resume_scheduling", "--background", "--batch-size", "7")
    assert "handed to the resumption queue" in out
    assert not scheduling.is_paused()
    [message] = queue_messages(broker, "resumption")
    assert message["task"] == "xmc.resumption.run" and message["args"][1] == 7


def test_it_explains_bad_command_input() -> None:
    with pytest.raises(CommandError, match="INVALID_ARGUMENT: reason is required"):
        call_command("pause_scheduling", "--reason", " ")
    with pytest.raises(CommandError, match="batch_size must be between"):
        call_command("resume_scheduling", "--batch-size", "0")
    assert not SchedulingSwitchChange.objects.exists()


# --- Admin ------------------------------------------------------------------------------


def test_it_pauses_and_resumes_from_the_admin(operator: Client, broker, django_capture_on_commit_callbacks) -> None:
    page = operator.get("/admin/workunits/schedulingswitch/")
    assert page.status_code == 200 and "Pause scheduling" in page.content.decode()
    form = {"action": "pause_scheduling", "_selected_action": ["1"]}
    asks = operator.post("/admin/workunits/schedulingswitch/", form)
    assert asks.status_code == 200 and 'name="reason"' in asks.content.decode()
    assert not scheduling.is_paused()  # nothing happens before the reason is given
    refused = operator.post("/admin/workunits/schedulingswitch/", {**form, "apply": "1", "reason": ""})
    assert "reason is required" in refused.content.decode() and not scheduling.is_paused()
    done = operator.post("/admin/workunits/schedulingswitch/", {**form, "apply": "1", "reason": "upgrade"})
    assert done.status_code == 302
    status = scheduling.get_status()
    assert (status.paused, status.changed_by, status.reason) == (True, OLIVIA, "upgrade")
    held(2)
    with django_capture_on_commit_callbacks(execute=True):
        operator.post("/admin/workunits/schedulingswitch/",
                      {"action": "resume_scheduling", "_selected_action": ["1"]})
    assert not scheduling.is_paused()
    [message] = queue_messages(broker, "resumption")
    assert message["task"] == "xmc.resumption.run"
    assert SchedulingSwitchChange.objects.count() == 2
    for url in ("/admin/workunits/schedulingswitchchange/", "/admin/workunits/pausedtask/"):
        assert operator.get(url).status_code == 200


# --- REST -------------------------------------------------------------------------------


@pytest.fixture
def _rest_urls(settings):
    settings.XMC_RATE_LIMIT_PER_S = 0
    with override_settings(ROOT_URLCONF="tests.api.rest.urls"):
        yield


@pytest.fixture
def staff_api(_rest_urls, make_user) -> Api:
    make_user("olivia", OLIVIA, is_staff=True)
    return Api(OLIVIA)


@pytest.fixture
def researcher_api(_rest_urls, alice, alice_api: Api) -> Api:
    return alice_api


def body(response) -> dict:
    return json.loads(response.content)


def test_it_lets_staff_pause_read_and_resume_over_rest(staff_api: Api, broker,
                                                       django_capture_on_commit_callbacks) -> None:
    status = body(staff_api.get("/v1/scheduling"))
    assert status == {"paused": False, "since": None, "changedBy": "", "reason": "", "pendingPausedTasks": 0}
    response = staff_api.post("/v1/scheduling:pause", {"reason": "cluster upgrade"})
    assert response.status_code == 200
    paused = body(response)
    assert (paused["paused"], paused["changedBy"], paused["reason"]) == (True, OLIVIA, "cluster upgrade")
    assert paused["since"].endswith("Z")
    held(2)
    assert body(staff_api.get("/v1/scheduling"))["pendingPausedTasks"] == 2
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_api.post("/v1/scheduling:resume", {"batchSize": 100})
    resumed = body(response)
    assert response.status_code == 200 and resumed["paused"] is False and resumed["wasPaused"] is True
    [message] = queue_messages(broker, "resumption")
    assert message["args"] == [resumed["resumptionRunId"], 100]


def test_it_refuses_non_staff_and_anonymous_callers(researcher_api: Api) -> None:
    for method, url in (("GET", "/v1/scheduling"), ("POST", "/v1/scheduling:pause"),
                        ("POST", "/v1/scheduling:resume")):
        response = researcher_api.call(method, url, {"reason": "mine"} if "pause" in url else None)
        assert response.status_code == 403, url
        assert body(response)["error"]["status"] == "PERMISSION_DENIED"
        anonymous = Api(None).call(method, url)
        assert anonymous.status_code == 401 and body(anonymous)["error"]["status"] == "UNAUTHENTICATED"
    assert not scheduling.is_paused()


@pytest.mark.parametrize(("url", "payload", "field"), [
    ("/v1/scheduling:pause", {}, "reason"),
    ("/v1/scheduling:pause", {"reason": ""}, "reason"),
    ("/v1/scheduling:pause", {"reason": 5}, "reason"),
    ("/v1/scheduling:pause", {"reason": "ok", "by": "someone"}, "by"),
    ("/v1/scheduling:pause", "not json", None),
    ("/v1/scheduling:pause", [1], None),
    ("/v1/scheduling:resume", {"batchSize": 0}, "batchSize"),
    ("/v1/scheduling:resume", {"batchSize": "10"}, "batchSize"),
    ("/v1/scheduling:resume", {"batch_size": 10}, "batch_size"),
])
def test_it_validates_the_body_and_changes_nothing(staff_api: Api, url, payload, field) -> None:
    response = staff_api.post(url, payload)
    assert response.status_code == 400
    error = body(response)["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    if field:
        assert error["details"][0]["fieldViolations"][0]["field"] == field
    assert not SchedulingSwitchChange.objects.exists()


def test_it_answers_a_wrong_method_in_the_api_shape(staff_api: Api) -> None:
    response = staff_api.call("DELETE", "/v1/scheduling")
    assert response.status_code == 405 and body(response)["error"]["status"] == "UNIMPLEMENTED"
