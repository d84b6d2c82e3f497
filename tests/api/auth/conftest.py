"""Helpers shared by the identity tests: fast password hashing and a live gRPC server.

The people (Alice, an ordinary researcher; Oscar, an operator; ``make_user``; ``fresh_email``)
are the suite's one plugin of people, tests/fixtures/people.py.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from xmc.auth.grpc import AuthInterceptor
from xmc.auth.identity import current_asserted_email, current_identity


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # PBKDF2 costs ~0.4 s per user; these tests are about tokens, not hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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
