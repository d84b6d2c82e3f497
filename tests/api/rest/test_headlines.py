"""``GET /v1/experiments/{xid}/headlines``: the server's one-line why of each work unit (issue 38, item 4)."""
from __future__ import annotations

import time

import pytest

from tests.api.rest.conftest import Api, World
from workunits import services, state
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db

OOM = "Out of memory (OOMKilled): replica train-0 (pod xmc-1-2-train-0-0-abcde) container main"


def test_it_answers_each_units_state_and_headline(world: World, alice_api: Api) -> None:
    services.update_work_unit_executions([ExecutionUpdate(
        xid=world.xid, wid=2, eid=1, mask=(state.STATE, state.SYSTEM_MESSAGE), state="FAILED",
        state_update_time_ns=time.time_ns(), system_message={"severity": "ERROR", "userFacingText": OOM})])
    response = alice_api.get(f"/v1/experiments/{world.xid}/headlines")
    assert response.status_code == 200, response.content
    assert response.json() == {"headlines": [
        {"name": f"experiments/{world.xid}/workUnits/1", "executionId": 1, "state": "INITIALIZING",
         "headline": "being handed to the cluster", "sentence": "Being handed to the cluster",
         "reason": {"code": "HANDING_TO_CLUSTER"}},
        {"name": f"experiments/{world.xid}/workUnits/2", "executionId": 1, "state": "FAILED",
         "headline": "out of memory (OOMKilled) in train-0", "sentence": "Out of memory (OOMKilled) in train-0",
         "reason": {"code": "FAILED", "cause": "OUT_OF_MEMORY", "replica": "train-0"}},
    ]}


def test_it_refuses_someone_elses_experiment_as_the_api_does(world: World, bob_api: Api) -> None:
    response = bob_api.get(f"/v1/experiments/{world.xid}/headlines")
    assert response.status_code == 403
    assert "error" in response.json()


def test_it_carries_a_queued_units_estimated_start_when_the_method_is_shown(
        world: World, alice_api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """``xmc why`` and ``xmc status`` print this headline: the estimate reaches the command line too."""
    from experiments.models import Experiment
    from tests import factories
    from tests.ui import pages
    from workunits import eta
    from workunits.models import WorkUnitExecution

    exp = Experiment.objects.get(id=world.xid)
    for _ in range(10):
        factories.work_unit(exp)
    for wid in range(3, 12):  # nine admissions, a second or two apart
        pages.move(world.xid, wid, 1, "SCHEDULING", "STARTING", publish=False)
    pages.move(world.xid, 12, 1, "SCHEDULING", publish=False)
    WorkUnitExecution.objects.filter(work_unit__experiment_id=world.xid, work_unit__wid=12).update(
        scheduling_information={"auxiliaryInfo": {"queueInfo": {"positionInQueue": 2, "totalWorkloadsInQueue": 4}}})

    def row() -> dict[str, object]:
        rows = alice_api.get(f"/v1/experiments/{world.xid}/headlines").json()["headlines"]
        return dict(next(r for r in rows if r["name"].endswith("/workUnits/12")))

    def headline() -> str:
        return str(row()["headline"])

    monkeypatch.setattr(eta, "ESTIMATE_MEASURED_ERROR", 0.2)
    assert headline().startswith("waiting for quota in cpu-queue: position 2 of 4. Estimated start "), headline()
    assert str(row()["sentence"]).startswith("Waiting for quota in cpu-queue: position 2 of 4. Estimated start ")
    assert row()["reason"] == {"code": "WAITING_FOR_QUOTA", "queue": "cpu-queue", "positionInQueue": 2,
                               "totalInQueue": 4}
    monkeypatch.setattr(eta, "ESTIMATE_MEASURED_ERROR", 0.6)  # past the 25 % bar: none
    assert headline() == "waiting for quota in cpu-queue: position 2 of 4"
