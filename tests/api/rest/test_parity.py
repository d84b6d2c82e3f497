"""A REST answer parses (``json_format.Parse``) into exactly the message the gRPC call returns.

The gRPC server calls `xmc.api.registry.invoke` with the request message; so
does ``grpc_call`` here. Each story asks both transports for the same thing
and compares the messages field for field.
"""
from __future__ import annotations

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from core import pb
from tests import factories
from tests.api.rest.conftest import Api, World, grpc_call
from xmc.api.registry import ESS, OPERATIONS

pytestmark = pytest.mark.django_db


def parsed(response: object, cls: type[Message]) -> Message:
    assert response.status_code == 200, response.content  # type: ignore[attr-defined]
    return json_format.Parse(response.content, cls())  # type: ignore[attr-defined]


def test_it_returns_the_same_experiment_over_rest_and_grpc(world: World, alice_api: Api) -> None:
    over_rest = parsed(alice_api.get(f"/v1/experiments/{world.xid}"), pb.experiment.Experiment)
    over_grpc = grpc_call(ESS, "GetExperiment", pb.api.GetExperimentRequest(name=f"experiments/{world.xid}"))
    assert over_rest == over_grpc
    assert over_rest.title == "resnet sweep" and over_rest.HasField("create_time")


def test_it_returns_the_same_work_unit_over_rest_and_grpc(world: World, alice_api: Api) -> None:
    over_rest = parsed(alice_api.get(f"/v1/{world.wu1}"), pb.work_unit.WorkUnit)
    over_grpc = grpc_call(ESS, "GetWorkUnit", pb.api.GetWorkUnitRequest(name=world.wu1))
    assert over_rest == over_grpc
    assert over_rest.executable.jobset.jobs[0].spec.resources.cpu_resources.memory_bytes == 4 << 30


def test_it_returns_the_same_work_unit_list_over_rest_and_grpc(world: World, alice_api: Api) -> None:
    over_rest = parsed(alice_api.get(f"/v1/experiments/{world.xid}/workUnits?pageSize=1"),
                       pb.api.ListWorkUnitsResponse)
    over_grpc = grpc_call(ESS, "ListWorkUnits",
                          pb.api.ListWorkUnitsRequest(parent=f"experiments/{world.xid}", page_size=1))
    assert [wu.name for wu in over_rest.work_units] == [world.wu1]
    assert over_rest.work_units == over_grpc.work_units
    # Tokens are signed with a timestamp, so two tokens for the same position differ as strings;
    # what must agree is the page each one leads to.
    next_pages = [
        grpc_call(ESS, "ListWorkUnits", pb.api.ListWorkUnitsRequest(
            parent=f"experiments/{world.xid}", page_size=1, page_token=token))
        for token in (over_rest.next_page_token, over_grpc.next_page_token)
    ]
    assert next_pages[0].work_units == next_pages[1].work_units
    assert [wu.name for wu in next_pages[0].work_units] == [f"experiments/{world.xid}/workUnits/2"]


def test_it_creates_an_artifact_over_rest_that_grpc_reads_back_identically(world: World, alice_api: Api) -> None:
    created = parsed(
        alice_api.post(f"/v1/{world.wu1}/artifacts", {
            "notes": "eval report", "tags": ["eval"], "dataType": "HTML_REPORT", "mimeType": "text/html",
            "priority": 3, "additionalInfo": {"title": "Eval", "text": "top-1 76.1%"},
            "payload": {"url": {"url": "https://example.com/report", "displayName": "report"}},
        }),
        pb.artifact.Artifact,
    )
    over_grpc = grpc_call(ESS, "GetArtifact", pb.api.GetArtifactRequest(name=created.name))
    over_rest = parsed(alice_api.get(f"/v1/{created.name}"), pb.artifact.Artifact)
    assert created == over_grpc == over_rest
    assert created.parent == world.wu1
    assert created.payload.url.display_name == "report"


def test_it_returns_the_same_long_running_operation_over_rest_and_grpc(world: World, alice_api: Api) -> None:
    op = parsed(alice_api.post(f"/v1/experiments/{world.xid}/workUnits?workUnitId=7",
                               json_format.MessageToDict(factories.work_unit_message())),
                pb.longrunning.Operation)
    over_grpc = grpc_call(OPERATIONS, "GetOperation", pb.longrunning.GetOperationRequest(name=op.name))
    assert parsed(alice_api.get(f"/v1/operations/{op.name}"), pb.longrunning.Operation) == over_grpc == op
    metadata = pb.operations.OperationMetadata()
    assert op.metadata.Unpack(metadata)
    assert metadata.target == f"experiments/{world.xid}/workUnits/7"
