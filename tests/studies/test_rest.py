"""Studies over REST: a researcher creates, reads, lists and stops a study; every unusable field is a 400
naming it, and nothing is created."""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client

from studies.models import Study, Trial
from tests import factories
from workunits.models import OutboxMessage
from xmc.auth.tokens import issue_token

ALICE, BOB = factories.ALICE, factories.BOB

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_rate_limit(settings: Any) -> None:
    settings.XMC_RATE_LIMIT_PER_S = 0


def call(method: str, path: str, body: Any = None, who: str = ALICE, **params: Any) -> tuple[int, Any]:
    url = path + ("?" + urlencode(params) if params else "")
    data = "" if body is None else (body if isinstance(body, (str, bytes)) else json.dumps(body))
    answer = Client().generic(method, url, data, content_type="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {issue_token(who)}")
    return answer.status_code, json.loads(answer.content)


def request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "templateWorkUnit": 1,
        "parameters": {"lr": {"logUniform": [1e-5, 1e-1]}, "batch_size": {"choice": [32, 64, 128]},
                       "dropout": {"uniform": [0, 0.5]}, "layers": {"int": [2, 8]}},
        "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"},
        "maxTrials": 40, "parallelTrials": 4, "sampler": "tpe", "pruner": {"median": {"warmupSteps": 5}},
    }
    body.update(overrides)
    return body


@pytest.fixture
def exp() -> Any:
    exp = factories.experiment(ALICE, title="search")
    factories.work_unit(exp)
    return exp


def test_it_creates_a_study_running_with_its_request_and_rings_the_controller(exp: Any) -> None:
    status, body = call("POST", f"/v1/experiments/{exp.id}/studies", request())
    assert status == 200, body
    assert body["state"] == "RUNNING" and body["name"] == f"experiments/{exp.id}/studies/{body['id']}"
    assert body["parameters"]["batch_size"] == {"choice": [32, 64, 128]}
    assert body["objective"] == {"metric": "loss", "stat": "last", "goal": "MINIMIZE"}
    assert body["trials"] == [] and body["bestTrial"] is None
    assert OutboxMessage.objects.filter(task_name="xmc.studies.step", args=[body["id"]], done=False).exists()
    status, got = call("GET", f"/v1/experiments/{exp.id}/studies/{body['id']}")
    assert status == 200 and got["maxTrials"] == 40 and got["pruner"] == {"median": {"warmupSteps": 5}}


BAD = [
    ({"templateWorkUnit": 99}, "templateWorkUnit"),
    ({"templateWorkUnit": "1"}, "templateWorkUnit"),
    ({"templateWorkUnit": None}, "templateWorkUnit"),
    ({"parameters": {}}, "parameters"),
    ({"parameters": []}, "parameters"),
    ({"parameters": {"lr": {"logUniform": [0, 1]}}}, "parameters.lr.logUniform"),
    ({"parameters": {"lr": {"logUniform": [0.1, 0.01]}}}, "parameters.lr.logUniform"),
    ({"parameters": {"lr": {"uniform": [1, 1]}}}, "parameters.lr.uniform"),
    ({"parameters": {"lr": {"uniform": [1]}}}, "parameters.lr.uniform"),
    ({"parameters": {"lr": {"uniform": ["a", 2]}}}, "parameters.lr.uniform[0]"),
    ({"parameters": {"n": {"int": [8, 2]}}}, "parameters.n.int"),
    ({"parameters": {"n": {"int": [1.5, 2]}}}, "parameters.n.int[0]"),
    ({"parameters": {"b": {"choice": []}}}, "parameters.b.choice"),
    ({"parameters": {"b": {"choice": [1, 1]}}}, "parameters.b.choice"),
    ({"parameters": {"b": {"choice": [{"x": 1}]}}}, "parameters.b.choice[0]"),
    ({"parameters": {"b": {"normal": [0, 1]}}}, "parameters.b"),
    ({"parameters": {"b": {"uniform": [0, 1], "int": [0, 1]}}}, "parameters.b"),
    ({"parameters": {"--x": {"uniform": [0, 1]}}}, "parameters.--x"),
    ({"objective": None}, "objective"),
    ({"objective": {"metric": "", "goal": "MINIMIZE"}}, "objective.metric"),
    ({"objective": {"metric": "loss", "goal": "LOWER"}}, "objective.goal"),
    ({"objective": {"metric": "loss", "goal": "MINIMIZE", "stat": "mean"}}, "objective.stat"),
    ({"objective": {"metric": "loss", "goal": "MINIMIZE", "weight": 1}}, "objective.weight"),
    ({"maxTrials": 0}, "maxTrials"),
    ({"maxTrials": None}, "maxTrials"),
    ({"maxTrials": 10_001}, "maxTrials"),
    ({"parallelTrials": 0}, "parallelTrials"),
    ({"parallelTrials": 41}, "parallelTrials"),
    ({"parallelTrials": True}, "parallelTrials"),
    ({"sampler": "bayes"}, "sampler"),
    ({"sampler": "grid"}, "parameters.dropout"),
    ({"pruner": "median"}, "pruner"),
    ({"pruner": {"hyperband": {}}}, "pruner"),
    ({"pruner": {"median": {"warmupSteps": -1}}}, "pruner.median.warmupSteps"),
    ({"pruner": {"median": {"patience": 3}}}, "pruner.median.patience"),
    ({"pruner": {"successiveHalving": {"reductionFactor": 1}}}, "pruner.successiveHalving.reductionFactor"),
    ({"seed": -1}, "seed"),
    ({"color": "red"}, "color"),
]


@pytest.mark.parametrize(("overrides", "field"), BAD, ids=[f for _, f in BAD])
def test_it_answers_an_unusable_field_with_a_400_naming_it_and_creates_nothing(exp: Any, overrides: dict[str, Any],
                                                                     field: str) -> None:
    status, body = call("POST", f"/v1/experiments/{exp.id}/studies", request(**overrides))
    assert status == 400, body
    assert body["error"]["status"] == "INVALID_ARGUMENT"
    assert body["error"]["details"][0]["fieldViolations"][0]["field"] == field
    assert not Study.objects.exists() and not OutboxMessage.objects.filter(task_name="xmc.studies.step").exists()


def test_it_answers_a_400_to_a_body_that_is_not_json_or_not_an_object(exp: Any) -> None:
    for body in ("{", "[1]"):
        status, answer = call("POST", f"/v1/experiments/{exp.id}/studies", body)
        assert status == 400 and answer["error"]["details"][0]["fieldViolations"][0]["field"] == "body"
    assert not Study.objects.exists()


def test_it_takes_int_and_choice_parameters_for_a_grid_study(exp: Any) -> None:
    status, body = call("POST", f"/v1/experiments/{exp.id}/studies", request(
        sampler="grid", parameters={"layers": {"int": [2, 4]}, "act": {"choice": ["relu", "gelu"]}}))
    assert status == 200 and body["sampler"] == "grid"


def test_it_refuses_a_stranger_reading_creating_or_stopping(exp: Any) -> None:
    status, body = call("POST", f"/v1/experiments/{exp.id}/studies", request(maxTrials=0), BOB)
    assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
    _, created = call("POST", f"/v1/experiments/{exp.id}/studies", request())
    for method, path in (("GET", ""), ("GET", f"/{created['id']}"), ("POST", f"/{created['id']}:stop")):
        status, body = call(method, f"/v1/experiments/{exp.id}/studies{path}", who=BOB)
        assert status == 403, (method, path)
    assert Client().get(f"/v1/experiments/{exp.id}/studies").status_code == 401


def test_it_answers_404_for_an_unknown_study(exp: Any) -> None:
    assert call("GET", f"/v1/experiments/{exp.id}/studies/999")[0] == 404
    assert call("POST", f"/v1/experiments/{exp.id}/studies/999:stop")[0] == 404


def test_it_asks_the_controller_on_stop_and_is_idempotent(exp: Any) -> None:
    _, created = call("POST", f"/v1/experiments/{exp.id}/studies", request())
    for _ in range(2):
        status, body = call("POST", f"/v1/experiments/{exp.id}/studies/{created['id']}:stop")
        assert status == 200 and body["stopRequested"] is True and body["state"] == "RUNNING"


def test_it_lists_newest_first_and_paginates_in_the_database(exp: Any) -> None:
    ids = [call("POST", f"/v1/experiments/{exp.id}/studies", request())[1]["id"] for _ in range(5)]
    seen: list[int] = []
    token = ""
    while True:
        status, body = call("GET", f"/v1/experiments/{exp.id}/studies", pageSize=2, pageToken=token)
        assert status == 200 and len(body["studies"]) <= 2
        seen += [s["id"] for s in body["studies"]]
        token = body["nextPageToken"]
        if not token:
            break
    assert seen == sorted(ids, reverse=True)
    status, body = call("GET", f"/v1/experiments/{exp.id}/studies", pageToken="garbage")
    assert status == 400 and body["error"]["details"][0]["fieldViolations"][0]["field"] == "pageToken"


def test_it_gives_a_studys_trials_by_number_a_page_at_a_time_with_the_best(exp: Any) -> None:
    from django.utils import timezone

    _, created = call("POST", f"/v1/experiments/{exp.id}/studies", request())
    study = Study.objects.get(id=created["id"])
    for n, value in enumerate([3.0, 1.0, None, 2.0, 0.5]):
        Trial.objects.create(study=study, number=n, wid=100 + n, parameters={"lr": 0.01}, value=value,
                             state="COMPLETED" if value is not None and n != 4 else ("PRUNED" if n == 4 else "FAILED"),
                             create_time=timezone.now())
    status, body = call("GET", f"/v1/experiments/{exp.id}/studies/{study.id}", pageSize=3)
    assert status == 200 and [t["number"] for t in body["trials"]] == [0, 1, 2]
    assert body["bestTrial"]["number"] == 1  # the pruned trial's 0.5 is no result
    assert body["trialCounts"] == {"RUNNING": 0, "COMPLETED": 3, "PRUNED": 1, "FAILED": 1}
    _, rest = call("GET", f"/v1/experiments/{exp.id}/studies/{study.id}", pageSize=3, pageToken=body["nextPageToken"])
    assert [t["number"] for t in rest["trials"]] == [3, 4] and rest["nextPageToken"] == ""


def test_it_is_in_the_openapi_document() -> None:
    document = json.loads(Client().get("/v1/openapi.json").content)
    paths = document["paths"]
    assert {"post", "get"} <= set(paths["/v1/experiments/{xid}/studies"])
    assert "get" in paths["/v1/experiments/{xid}/studies/{study_id}"]
    assert "post" in paths["/v1/experiments/{xid}/studies/{study_id}:stop"]


def test_it_finds_a_study_only_under_its_own_experiment(exp: Any) -> None:
    other = factories.experiment(ALICE, title="other")
    factories.work_unit(other)
    _, created = call("POST", f"/v1/experiments/{exp.id}/studies", request())
    assert call("GET", f"/v1/experiments/{other.id}/studies/{created['id']}")[0] == 404
    assert call("POST", f"/v1/experiments/{other.id}/studies/{created['id']}:stop")[0] == 404
    assert call("GET", f"/v1/experiments/{other.id}/studies")[1]["studies"] == []
    # A template must be a unit of the study's own experiment (wid 2 is one of exp's, not of other's).
    assert factories.work_unit(exp).wid == 2
    status, body = call("POST", f"/v1/experiments/{other.id}/studies", request(templateWorkUnit=2))
    assert status == 400 and body["error"]["details"][0]["fieldViolations"][0]["field"] == "templateWorkUnit"
