"""Every HTTP binding, called over HTTP with a bearer token, reaching the real handler.

One case per row of `xmc.api.rest.BINDINGS` (a test makes sure none is
missing): Alice calls the binding on her experiment and the answer carries
what the RPC promises, in proto3 JSON.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf import json_format

from django.utils import timezone

from metrics import services as metric_services
from tests import factories
from tests.api.rest.conftest import ALICE, Api, World
from xmc.api.rest import BINDINGS, Binding

pytestmark = pytest.mark.django_db

OPERATION_METADATA = "type.googleapis.com/cloud.xmanager.v1.OperationMetadata"


@dataclass(frozen=True)
class Case:
    url: Callable[[World], str]
    check: Callable[[World, dict[str, Any]], bool]  # the answer is what the RPC promises
    body: Callable[[World], Any] | None = None


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [item["name"] for item in items]


def _work_unit_json() -> dict[str, Any]:
    return json_format.MessageToDict(factories.work_unit_message())


def _check_operation(action: str, target: Callable[[World], str]) -> Callable[[World, dict[str, Any]], bool]:
    def check(w: World, op: dict[str, Any]) -> bool:
        return (
            op["name"].startswith(f"experiments/{w.xid}/")
            and op["metadata"]["@type"] == OPERATION_METADATA
            and op["metadata"]["actionType"] == action
            and op["metadata"]["target"] == target(w)
        )

    return check


E = "/v1/experiments/{xid}"
WU1 = "/v1/experiments/{xid}/workUnits/1"

CASES: dict[str, Case] = {
    "POST /v1/experiments": Case(
        url=lambda w: "/v1/experiments",
        body=lambda w: {"title": "fresh", "tags": ["new"]},
        check=lambda w, r: (r["title"], r["creator"], r["status"]["launchState"]) == ("fresh", ALICE, "LAUNCHING"),
    ),
    "POST /v1/{name=experiments/*}:updateLaunchState": Case(
        url=lambda w: f"/v1/experiments/{w.xid}:updateLaunchState",
        body=lambda w: {"launchState": "COMPLETED"},
        check=lambda w, r: r["status"]["launchState"] == "COMPLETED",
    ),
    "GET /v1/{name=experiments/*}": Case(
        url=lambda w: f"/v1/experiments/{w.xid}",
        check=lambda w, r: (r["name"], r["title"]) == (f"experiments/{w.xid}", "resnet sweep"),
    ),
    "GET /v1/{name=experiments/*}/status": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/status",
        check=lambda w, r: r["activeState"] == "ACTIVE",
    ),
    "GET /v1/experiments": Case(
        url=lambda w: "/v1/experiments?pageSize=10",
        check=lambda w, r: _names(r["experiments"]) == [f"experiments/{w.xid}"],
    ),
    "GET /v1/experiments:search": Case(
        url=lambda w: '/v1/experiments:search?filter=title%3D%22resnet%20sweep%22',
        check=lambda w, r: _names(r["experiments"]) == [f"experiments/{w.xid}"],
    ),
    "PATCH /v1/{experiment.name=experiments/*}": Case(
        url=lambda w: f"/v1/experiments/{w.xid}?updateMask=title",
        body=lambda w: {"title": "renamed", "notes": "not in the mask"},
        check=lambda w, r: (r["title"], r.get("notes", "")) == ("renamed", ""),
    ),
    "POST /v1/{parent=experiments/*}/workUnits": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits?workUnitId=3",
        body=lambda w: _work_unit_json(),
        check=_check_operation("CREATE", lambda w: f"experiments/{w.xid}/workUnits/3"),
    ),
    "GET /v1/{name=experiments/*/workUnits/*}": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1",
        check=lambda w, r: r["name"] == w.wu1 and "executable" in r,
    ),
    "GET /v1/{name=experiments/*/workUnits/*}/currentExecution": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1/currentExecution",
        check=lambda w, r: r["name"] == f"{w.wu1}/executions/1",
    ),
    "GET /v1/{parent=experiments/*/workUnits/*}/executions": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1/executions",
        check=lambda w, r: _names(r["workUnitExecutions"]) == [f"{w.wu1}/executions/1"],
    ),
    "GET /v1/{parent=experiments/*}/workUnits": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits",
        check=lambda w, r: _names(r["workUnits"]) == [w.wu1, f"experiments/{w.xid}/workUnits/2"],
    ),
    "GET /v1/{parent=experiments/*}/workUnits:search": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits:search?filter=wid%3D2",
        check=lambda w, r: _names(r["workUnits"]) == [f"experiments/{w.xid}/workUnits/2"],
    ),
    "POST /v1/{name=experiments/*/workUnits/*}:stop": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1:stop",
        body=lambda w: {},
        check=_check_operation("STOP", lambda w: w.wu1),
    ),
    "POST /v1/{parent=experiments/*}/workUnits:batchStop": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits:batchStop",
        body=lambda w: {"filter": "wid = 1"},
        check=_check_operation("STOP", lambda w: f"experiments/{w.xid}"),
    ),
    "POST /v1/{name=experiments/*/workUnits/*}:restart": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1:restart",
        body=lambda w: {},
        check=_check_operation("RESTART", lambda w: w.wu1),
    ),
    "POST /v1/{parent=experiments/*}/workUnits:batchRestart": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits:batchRestart",
        body=lambda w: {},
        check=_check_operation("RESTART", lambda w: f"experiments/{w.xid}"),
    ),
    "PATCH /v1/{work_unit.name=experiments/*/workUnits/*}": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1?updateMask=notes,tags",
        body=lambda w: {"notes": "lr=0.1", "tags": ["best"], "priority": "HIGH"},
        check=lambda w, r: (r["notes"], r["tags"], r.get("priority")) == ("lr=0.1", ["best"], "NORMAL"),
    ),
    "POST /v1/{parent=experiments/*}/artifacts": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/artifacts",
        body=lambda w: {"notes": "dataset", "dataType": "ML_DATASET"},
        check=lambda w, r: (r["parent"], r["dataType"]) == (f"experiments/{w.xid}", "ML_DATASET"),
    ),
    "POST /v1/{parent=experiments/*/workUnits/*}/artifacts": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1/artifacts",
        body=lambda w: {"notes": "logs", "lifecyclePhase": "OUTPUT"},
        check=lambda w, r: (r["parent"], r["lifecyclePhase"]) == (w.wu1, "OUTPUT"),
    ),
    "GET /v1/{name=artifacts/*}": Case(
        url=lambda w: f"/v1/{w.artifact_name}",
        check=lambda w, r: (r["name"], r["notes"]) == (w.artifact_name, "final checkpoint"),
    ),
    "GET /v1/artifacts": Case(
        url=lambda w: "/v1/artifacts",
        check=lambda w, r: _names(r["artifacts"]) == [w.artifact_name],
    ),
    "GET /v1/{parent=experiments/*}/artifacts": Case(
        # The world's artifact hangs off work unit 1: the experiment's own list is empty.
        url=lambda w: f"/v1/experiments/{w.xid}/artifacts",
        check=lambda w, r: r.get("artifacts", []) == [],
    ),
    "GET /v1/{parent=experiments/*/workUnits/*}/artifacts": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/2/artifacts",
        check=lambda w, r: r.get("artifacts", []) == [],
    ),
    "GET /v1/artifacts:search": Case(
        url=lambda w: "/v1/artifacts:search?filter=tags%3Ackpt",
        check=lambda w, r: _names(r["artifacts"]) == [w.artifact_name],
    ),
    "GET /v1/{parent=experiments/*}/artifacts:search": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/artifacts:search?filter=tags%3Anope",
        check=lambda w, r: r.get("artifacts", []) == [],
    ),
    "GET /v1/{parent=experiments/*/workUnits/*}/artifacts:search": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1/artifacts:search?filter=tags%3Ackpt",
        check=lambda w, r: _names(r["artifacts"]) == [w.artifact_name],
    ),
    "DELETE /v1/{name=artifacts/*}": Case(
        url=lambda w: f"/v1/{w.artifact_name}",
        check=lambda w, r: r == {},
    ),
    "PATCH /v1/{artifact.name=artifacts/*}": Case(
        url=lambda w: f"/v1/{w.artifact_name}?update_mask=notes",
        body=lambda w: {"notes": "best checkpoint"},
        check=lambda w, r: r["notes"] == "best checkpoint",
    ),
    "GET /v1/{parent=experiments/*}/statusMessages": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/statusMessages",
        check=lambda w, r: sorted(m["content"]["userFacingText"] for m in r["statusMessages"])
        == ["experiment started", "pulling image"],
    ),
    "GET /v1/{parent=experiments/*/workUnits/*}/statusMessages": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1/statusMessages",
        check=lambda w, r: [m["content"]["userFacingText"] for m in r["statusMessages"]] == ["pulling image"],
    ),
    "GET /v1/{parent=experiments/*}/statusMessages:search": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/statusMessages:search?filter=execution_id%3D0",
        check=lambda w, r: [m["content"]["userFacingText"] for m in r["statusMessages"]] == ["experiment started"],
    ),
    "GET /v1/{parent=experiments/*/workUnits/*}/statusMessages:search": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/1/statusMessages:search?filter=severity%3DINFO",
        check=lambda w, r: [m["executionId"] for m in r["statusMessages"]] == ["1"],
    ),
    "GET /v1/operations/{name=**}": Case(
        url=lambda w: f"/v1/operations/{w.create_operation}",
        check=lambda w, r: r["name"] == w.create_operation,
    ),
    "GET /v1/{name=experiments/*/operations/*}": Case(
        url=lambda w: f"/v1/{w.batch_operation}",
        check=lambda w, r: (r["name"], r["metadata"]["actionType"]) == (w.batch_operation, "STOP"),
    ),
    "GET /v1/{name=experiments/*/workUnits/*/operations/*}": Case(
        url=lambda w: f"/v1/{w.create_operation}",
        check=lambda w, r: (r["name"], r["metadata"]["actionType"]) == (w.create_operation, "CREATE"),
    ),
    "GET /v1/{name=experiments/*/operations}": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/operations",
        check=lambda w, r: w.create_operation in _names(r["operations"]),
    ),
    "GET /v1/{name=experiments/*/workUnits/*/operations}": Case(
        url=lambda w: f"/v1/experiments/{w.xid}/workUnits/2/operations",
        check=lambda w, r: all(n.startswith(f"experiments/{w.xid}/workUnits/2/") for n in _names(r["operations"]))
        and len(r["operations"]) >= 1,
    ),
    "POST /v1/operations/{name=**}:cancel": Case(
        url=lambda w: f"/v1/operations/{w.create_operation}:cancel",
        body=lambda w: {},
        check=lambda w, r: r == {},
    ),
    "DELETE /v1/operations/{name=**}": Case(
        url=lambda w: f"/v1/operations/{w.done_operation}",
        check=lambda w, r: r == {},
    ),
    # cloud.xmanager.v1.DashboardService: chart c<xid> on work unit 1, dashboard d<xid> holding it.
    "POST /v1/dashboards": Case(
        url=lambda w: "/v1/dashboards",
        body=lambda w: {"dashboard": {"title": "new", "chartIds": [f"c{w.xid}"]}, "dashboardId": f"n{w.xid}"},
        check=lambda w, r: (r["name"], r["owner"], r["chartIds"]) == (f"dashboards/n{w.xid}", ALICE, [f"c{w.xid}"]),
    ),
    "GET /v1/{name=dashboards/*}": Case(
        url=lambda w: f"/v1/dashboards/d{w.xid}",
        check=lambda w, r: (r["name"], r["chartIds"]) == (f"dashboards/d{w.xid}", [f"c{w.xid}"]),
    ),
    "GET /v1/dashboards": Case(
        url=lambda w: f"/v1/dashboards?filter=charts.experiment_id%3D{w.xid}",
        check=lambda w, r: _names(r["dashboards"]) == [f"dashboards/d{w.xid}"],
    ),
    "PATCH /v1/{dashboard.name=dashboards/*}": Case(
        url=lambda w: f"/v1/dashboards/d{w.xid}",
        body=lambda w: {"title": "renamed"},
        check=lambda w, r: (r["title"], r["chartIds"]) == ("renamed", [f"c{w.xid}"]),
    ),
    "DELETE /v1/{name=dashboards/*}": Case(url=lambda w: f"/v1/dashboards/d{w.xid}", check=lambda w, r: r == {}),
    "POST /v1/{parent=experiments/*/workUnits/*}/charts": Case(
        url=lambda w: f"{WU1.format(xid=w.xid)}/charts?chartId=fresh{w.xid}",
        body=lambda w: {"title": "acc", "plots": [{"plotId": "a", "type": "SCATTER", "data": {"metrics": ["acc"]}}]},
        check=lambda w, r: (r["name"], r["xid"]) == (f"{w.wu1}/charts/fresh{w.xid}", str(w.xid)),
    ),
    "GET /v1/{name=charts/*}": Case(
        url=lambda w: f"/v1/charts/c{w.xid}",
        check=lambda w, r: r["name"] == f"{w.wu1}/charts/c{w.xid}",
    ),
    "GET /v1/{name=experiments/*/workUnits/*/charts/*}:getData": Case(
        url=lambda w: f"/v1/{w.wu1}/charts/c{w.xid}:getData?chartWidthPixels=10",
        check=lambda w, r: [p["scatterSeries"]["metricName"] for p in r["plotsData"]] == ["loss"],
    ),
    "GET /v1/{name=charts/*}:getData": Case(
        url=lambda w: f"/v1/charts/c{w.xid}:getData",
        check=lambda w, r: len(r["plotsData"][0]["scatterSeries"]["points"]) == 3,
    ),
    "GET /v1/{name=dashboards/*/charts/*}:getData": Case(
        url=lambda w: f"/v1/dashboards/d{w.xid}/charts/c{w.xid}:getData",
        check=lambda w, r: r["name"] == f"dashboards/d{w.xid}/charts/c{w.xid}" and r["xid"] == str(w.xid),
    ),
    "GET /v1/{parent=dashboards/*}/charts": Case(
        url=lambda w: f"/v1/dashboards/d{w.xid}/charts",
        check=lambda w, r: _names(r["charts"]) == [f"{w.wu1}/charts/c{w.xid}"],
    ),
    "GET /v1/{parent=experiments/*/workUnits/*}/charts": Case(
        url=lambda w: f"/v1/{w.wu1}/charts",
        check=lambda w, r: _names(r["charts"]) == [f"{w.wu1}/charts/c{w.xid}"],
    ),
    "PATCH /v1/{chart.name=experiments/*/workUnits/*/charts/*}": Case(
        url=lambda w: f"/v1/{w.wu1}/charts/c{w.xid}", body=lambda w: {"title": "t1"},
        check=lambda w, r: r["title"] == "t1",
    ),
    "PATCH /v1/{chart.name=charts/*}": Case(
        url=lambda w: f"/v1/charts/c{w.xid}", body=lambda w: {"title": "t2"}, check=lambda w, r: r["title"] == "t2",
    ),
    "PATCH /v1/{chart.name=dashboards/*/charts/*}": Case(
        url=lambda w: f"/v1/dashboards/d{w.xid}/charts/c{w.xid}", body=lambda w: {"description": "d"},
        check=lambda w, r: (r["title"], r["description"]) == ("loss", "d"),
    ),
    "DELETE /v1/{name=experiments/*/workUnits/*/charts/*}": Case(
        url=lambda w: f"/v1/{w.wu1}/charts/c{w.xid}", check=lambda w, r: r == {}),
    "DELETE /v1/{name=charts/*}": Case(url=lambda w: f"/v1/charts/c{w.xid}", check=lambda w, r: r == {}),
    "DELETE /v1/{name=dashboards/*/charts/*}": Case(
        url=lambda w: f"/v1/dashboards/d{w.xid}/charts/c{w.xid}", check=lambda w, r: r == {}),
}


def test_it_has_a_case_for_every_binding() -> None:
    assert sorted(CASES) == sorted(b.label for b in BINDINGS)


@pytest.fixture
def batch_world(world: World, alice_api: Api) -> World:
    """The world plus experiment-level stop operations (one pending, one done), for the operation bindings."""
    response = alice_api.post(f"/v1/experiments/{world.xid}/workUnits:batchStop", {"filter": "wid = 2"})
    assert response.status_code == 200, response.content
    assert "done" not in response.json(), response.content
    world.batch_operation = response.json()["name"]
    # Work unit 2 is stopping now: a second batch has nothing left to do and is done at once.
    response = alice_api.post(f"/v1/experiments/{world.xid}/workUnits:batchStop", {"filter": "wid = 2"})
    assert response.json()["done"] is True, response.content
    world.done_operation = response.json()["name"]
    # A chart with three points and a dashboard holding it, for the DashboardService bindings.
    response = alice_api.post(f"/v1/{world.wu1}/charts?chartId=c{world.xid}", {
        "title": "loss", "plots": [{"plotId": "l", "type": "SCATTER", "data": {"metrics": ["loss"]}}]})
    assert response.status_code == 200, response.content
    execution = world.work_units[0].executions.get(eid=1)
    metric_services.write_points(execution.pk, [
        metric_services.Point("loss", step, 1.0 / (step + 1), timezone.now()) for step in range(3)])
    response = alice_api.post("/v1/dashboards", {"dashboard": {"title": "d", "chartIds": [f"c{world.xid}"]},
                                                 "dashboardId": f"d{world.xid}"})
    assert response.status_code == 200, response.content
    return world


@pytest.mark.parametrize("binding", BINDINGS, ids=lambda b: b.label)
def test_it_serves_the_binding_over_http_with_a_bearer_token(binding: Binding, batch_world: World,
                                                            alice_api: Api) -> None:
    case = CASES[binding.label]
    body = case.body(batch_world) if case.body else None
    response = alice_api.call(binding.http_method, case.url(batch_world), body)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    assert case.check(batch_world, response.json()), response.json()


def test_it_needs_no_csrf_token_for_bearer_calls(world: World) -> None:
    strict = Api(ALICE, enforce_csrf_checks=True)
    response = strict.post(f"/v1/experiments/{world.xid}:updateLaunchState", {"launchState": "COMPLETED"})
    assert response.status_code == 200, response.content

