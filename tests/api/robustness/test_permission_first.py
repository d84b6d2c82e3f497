"""AIP-211: a caller who could not read a resource gets PERMISSION_DENIED whether or not it exists."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.message import Message

from core import errors
from core.pb import api
from core.pb import longrunning as lro
from tests.api.rest.conftest import ALICE, BOB, World, grpc_call
from xmc.api.registry import ESS, OPERATIONS, Caller, invoke
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db

MISSING_XID = 987654321


def requests(world: World, xid: int, wid: int, aid: str, op: str) -> list[tuple[str, str, Message]]:
    wu = f"experiments/{xid}/workUnits/{wid}"
    return [
        (ESS, "GetExperiment", api.GetExperimentRequest(name=f"experiments/{xid}")),
        (ESS, "GetWorkUnit", api.GetWorkUnitRequest(name=wu)),
        (ESS, "GetCurrentWorkUnitExecution", api.GetCurrentWorkUnitExecutionRequest(name=wu)),
        (ESS, "StopWorkUnit", api.StopWorkUnitRequest(name=wu)),
        (ESS, "GetArtifact", api.GetArtifactRequest(name=aid)),
        (ESS, "ListStatusMessages", api.ListStatusMessagesRequest(parent=wu)),
        (OPERATIONS, "GetOperation", lro.GetOperationRequest(name=op)),
    ]


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except errors.ServiceError as exc:
        return exc.code
    return "OK"


def test_it_denies_a_stranger_alike_for_existing_and_missing_resources(world: World) -> None:
    existing = requests(world, world.xid, 1, world.artifact_name, world.create_operation)
    missing = requests(world, MISSING_XID, 1, "artifacts/987654321",
                       f"experiments/{MISSING_XID}/workUnits/1/operations/1")
    for (service, method, request), (_, _, ghost) in zip(existing, missing):
        assert outcome(lambda: grpc_call(service, method, request, email=BOB)) == "PERMISSION_DENIED", method
        assert outcome(lambda: grpc_call(service, method, ghost, email=BOB)) == "PERMISSION_DENIED", method


def test_it_tells_a_reader_what_is_missing_inside_what_they_can_read(world: World) -> None:
    wu = f"experiments/{world.xid}/workUnits/99"
    assert outcome(lambda: grpc_call(ESS, "GetWorkUnit", api.GetWorkUnitRequest(name=wu), email=ALICE)) == "NOT_FOUND"
    op = f"experiments/{world.xid}/operations/987654"
    assert outcome(lambda: grpc_call(OPERATIONS, "GetOperation", lro.GetOperationRequest(name=op))) == "NOT_FOUND"


def test_it_still_answers_not_found_to_staff(world: World) -> None:
    staff = Caller(identity=Identity(email="root@example.com", is_staff=True))
    for service, method, request in requests(world, MISSING_XID, 1, "artifacts/987654321",
                                             f"experiments/{MISSING_XID}/operations/1"):
        assert outcome(lambda: invoke(service, method, request, staff)) == "NOT_FOUND", method
