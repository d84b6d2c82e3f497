"""The ACL matrix over gRPC: every RPC x every persona, and anonymous.

The same cases as tests/api/test_authorization_matrix.py, through the live
server and the wheel's stubs: allowed calls succeed, forbidden ones are
PERMISSION_DENIED, calls without a token UNAUTHENTICATED.
"""
from __future__ import annotations

from typing import Any

import grpc
import pytest

from core import pb
from experiments.acl import Role
from tests.api.acl_cases import CASES, NOT_FOUND_WHEN_UNREADABLE, PERSONAS, build_world
from tests.api.acl_personas import persona_tokens
from xmc.api.registry import DASHBOARDS, ESS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("persona", sorted(PERSONAS) + ["anonymous"])
def test_it_enforces_the_acl_over_grpc(persona: str, ess: Any, operations: Any, channel: grpc.Channel) -> None:
    dashboards = pb.dashboard_grpc.DashboardServiceStub(channel)
    tokens = persona_tokens()
    metadata = [("authorization", f"Bearer {tokens[persona]}")] if persona in tokens else []
    outcomes = {}
    for (service, method), (build, needed) in sorted(CASES.items()):
        request = build(build_world())
        stub = ess if service == ESS else dashboards if service == DASHBOARDS else operations
        try:
            getattr(stub, method)(request, metadata=metadata, timeout=30)
            code = grpc.StatusCode.OK
        except grpc.RpcError as error:
            code = error.code()
        if persona == "anonymous":
            expected = grpc.StatusCode.UNAUTHENTICATED
        else:
            role = PERSONAS[persona][1]
            expected = (grpc.StatusCode.OK if role >= needed else grpc.StatusCode.NOT_FOUND
                        if (service, method) in NOT_FOUND_WHEN_UNREADABLE and role < Role.READER
                        else grpc.StatusCode.PERMISSION_DENIED)
        outcomes[method] = (code, expected)
    assert {k: v for k, v in outcomes.items() if v[0] != v[1]} == {}
