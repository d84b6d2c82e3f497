"""The gRPC interceptor on a live server: who may call, and who the handler sees.

The server (fixture `grpc_target` in conftest) has the standard health
service (exempt) and a tiny generic service whose handlers report
`current_identity()` and the asserted email.
"""
from __future__ import annotations

import json
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.api.auth.conftest import SERVICE
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db(transaction=True)


def _metadata(token: str | None, asserted: str | None = None) -> list[tuple[str, str]]:
    # What the real client sends (contract 1.4): lower-case keys.
    metadata = []
    if token is not None:
        metadata.append(("authorization", f"Bearer {token}"))
    if asserted is not None:
        metadata.append(("x-goog-user-email", asserted))
    return metadata


def _whoami_call(channel: grpc.Channel, metadata: list[tuple[str, str]]) -> dict[str, Any]:
    call = channel.unary_unary(f"/{SERVICE}/Get")
    return json.loads(call(b"", metadata=metadata, timeout=10))


def test_it_lets_alice_in_and_tells_the_handler_it_is_her(channel: grpc.Channel, alice: Any) -> None:
    seen = _whoami_call(channel, _metadata(issue_token("alice@example.com"), "alice@example.com"))
    assert seen == {"email": "alice@example.com", "is_staff": False, "groups": [], "asserted": "alice@example.com"}


def test_it_shows_oscar_as_staff_with_his_groups(channel: grpc.Channel, oscar: Any) -> None:
    seen = _whoami_call(channel, _metadata(issue_token("oscar@example.com")))
    assert seen["is_staff"] is True
    assert seen["groups"] == ["ml-infra", "sre"]
    assert seen["asserted"] is None


def test_it_never_believes_the_asserted_email(channel: grpc.Channel, alice: Any, oscar: Any) -> None:
    # Alice's token, Oscar's email asserted: she stays Alice; the claim is kept for audit.
    seen = _whoami_call(channel, _metadata(issue_token("alice@example.com"), "oscar@example.com"))
    assert seen["email"] == "alice@example.com"
    assert seen["is_staff"] is False
    assert seen["asserted"] == "oscar@example.com"


def test_it_refuses_a_call_with_only_an_asserted_email(channel: grpc.Channel) -> None:
    # Contract 1.4, row 3: XMC_USER_EMAIL set, no token.
    with pytest.raises(grpc.RpcError) as refused:
        _whoami_call(channel, _metadata(None, "carol@example.com"))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "missing bearer token" in refused.value.details()


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("opaque-tok-123", "malformed token"),
        # An unsigned token of the kind the real client would happily decode.
        ("eyJhbGciOiJub25lIn0.eyJlbWFpbCI6Im9zY2FyQGV4YW1wbGUuY29tIn0.", "algorithm not allowed"),
    ],
)
def test_it_refuses_tokens_that_are_not_ours(channel: grpc.Channel, token: str, reason: str) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _whoami_call(channel, _metadata(token))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert reason in refused.value.details()


def test_it_refuses_an_expired_token(channel: grpc.Channel) -> None:
    expired = issue_token("alice@example.com", ttl_s=60, now=time.time() - 3600)
    with pytest.raises(grpc.RpcError) as refused:
        _whoami_call(channel, _metadata(expired))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == "invalid bearer token: token expired"


def test_it_refuses_two_authorization_headers(channel: grpc.Channel) -> None:
    token = issue_token("alice@example.com")
    with pytest.raises(grpc.RpcError) as refused:
        _whoami_call(channel, [("authorization", f"Bearer {token}"), ("authorization", "Bearer other")])
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_it_binds_the_identity_while_a_stream_is_produced(channel: grpc.Channel) -> None:
    call = channel.unary_stream(f"/{SERVICE}/Count")
    replies = list(call(b"", metadata=_metadata(issue_token("bob@example.com")), timeout=10))
    assert replies == [b"0:bob@example.com", b"1:bob@example.com", b"2:bob@example.com"]


def test_it_leaves_health_checks_open_to_callers_without_a_token(channel: grpc.Channel) -> None:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_it_still_answers_unimplemented_for_unknown_methods(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        channel.unary_unary(f"/{SERVICE}/Nope")(b"", metadata=_metadata(issue_token("a@example.com")), timeout=10)
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
