"""Personas and helpers shared by the identity tests.

Alice is an ordinary researcher, Oscar an operator (Django staff, in the
"sre" group), Dora a deactivated user. Rate-limit tests use fresh emails so
buckets left in Redis by earlier runs never matter.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from django.contrib.auth.models import Group
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from xmc.auth.grpc import AuthInterceptor
from xmc.auth.identity import current_asserted_email, current_identity

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # PBKDF2 costs ~0.4 s per user; these tests are about tokens, not hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def make_user(django_user_model: Any) -> Callable[..., Any]:
    def make(
        username: str,
        email: str,
        *,
        is_staff: bool = False,
        is_active: bool = True,
        groups: tuple[str, ...] = (),
    ) -> Any:
        user = django_user_model.objects.create_user(
            username=username, email=email, password=PASSWORD, is_staff=is_staff, is_active=is_active
        )
        for name in groups:
            group, _ = Group.objects.get_or_create(name=name)
            user.groups.add(group)
        return user

    return make


@pytest.fixture
def alice(make_user: Callable[..., Any]) -> Any:
    return make_user("alice", "alice@example.com")


@pytest.fixture
def oscar(make_user: Callable[..., Any]) -> Any:
    return make_user("oscar", "Oscar@Example.com", is_staff=True, groups=("sre", "ml-infra"))


@pytest.fixture
def fresh_email() -> Callable[[str], str]:
    """A new email per call: its rate-limit bucket has never been used."""
    return lambda who: f"{who}-{uuid.uuid4().hex[:12]}@example.com"


# --- A live gRPC server behind the interceptor -------------------------------

SERVICE = "xmc.test.WhoAmI"


def _whoami(request: bytes, context: grpc.ServicerContext) -> bytes:
    identity = current_identity()
    return json.dumps(
        {
            "email": identity.email,
            "is_staff": identity.is_staff,
            "groups": sorted(identity.groups),
            "asserted": current_asserted_email(),
        }
    ).encode()


def _count(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    for i in range(3):
        yield f"{i}:{current_identity().email}".encode()


@pytest.fixture
def grpc_target() -> Iterator[str]:
    executor = ThreadPoolExecutor(max_workers=4)
    server = grpc.server(executor, interceptors=[AuthInterceptor()])
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Get": grpc.unary_unary_rpc_method_handler(_whoami),
                    "Count": grpc.unary_stream_rpc_method_handler(_count),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()
        executor.shutdown(wait=True)  # ends the worker threads and their DB connections


@pytest.fixture
def channel(grpc_target: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(grpc_target) as ch:
        yield ch
