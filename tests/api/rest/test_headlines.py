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
         "headline": "being handed to the cluster"},
        {"name": f"experiments/{world.xid}/workUnits/2", "executionId": 1, "state": "FAILED",
         "headline": "out of memory (OOMKilled) in train-0"},
    ]}


def test_it_refuses_someone_elses_experiment_as_the_api_does(world: World, bob_api: Api) -> None:
    response = bob_api.get(f"/v1/experiments/{world.xid}/headlines")
    assert response.status_code == 403
    assert "error" in response.json()
