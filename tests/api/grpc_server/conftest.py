"""A live gRPC server (the real `xmc.api.grpc_server.build_server`) for the whole session.

The server runs in this process on a free port with the real interceptors and
the real handlers; tests talk to it through a real channel and the stubs
generated in the ``xmanager`` wheel. Its worker threads open their own
database connections, so tests that reach the database are
``django_db(transaction=True)``: their rows are committed and visible to the
server, and the tables are flushed afterwards.

Tokens come from `xmc.auth.tokens.issue_token`. Callers that do many calls use
`fresh_email` so the per-identity rate-limit buckets left in Redis by earlier
tests or runs never matter.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.longrunning import operations_pb2_grpc

from core import pb
from xmc.api.grpc_server import build_server, close_worker_connections, shutdown
from xmc.auth.tokens import issue_token

#: Handler threads of the session server; also the most DB connections it may hold.
MAX_WORKERS = 8


@pytest.fixture(scope="session")
def grpc_server(django_db_setup: Any, django_db_blocker: Any) -> Iterator[tuple[grpc.Server, int]]:
    # django_db_setup first: the worker threads must connect to the test database.
    server, port = build_server(0, MAX_WORKERS, host="127.0.0.1")
    server.start()
    try:
        yield server, port
    finally:
        shutdown(server, grace_s=1)


@pytest.fixture(autouse=True)
def _server_connections_closed_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """No worker thread keeps a (CONN_MAX_AGE) connection from one test into the next.

    A later test may run without database access (pytest-django then blocks
    every connection use, in every thread), and a kept connection would also
    block dropping the test database at the end.
    """
    yield
    if "grpc_server" in request.fixturenames:
        close_worker_connections(request.getfixturevalue("grpc_server")[0])


@pytest.fixture(scope="session")
def grpc_target(grpc_server: tuple[grpc.Server, int]) -> str:
    return f"127.0.0.1:{grpc_server[1]}"


@pytest.fixture(scope="session")
def channel(grpc_target: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(grpc_target) as ch:
        grpc.channel_ready_future(ch).result(timeout=10)
        yield ch


@pytest.fixture
def ess(channel: grpc.Channel) -> Any:
    return pb.api_grpc.ExperimentStateServiceStub(channel)


@pytest.fixture
def operations(channel: grpc.Channel) -> Any:
    return operations_pb2_grpc.OperationsStub(channel)


def metadata_for(email: str | None, asserted: str | None = None) -> list[tuple[str, str]]:
    """What the real client sends (contract 1.4): a bearer token and the asserted email."""
    md: list[tuple[str, str]] = []
    if email is not None:
        md.append(("authorization", f"Bearer {issue_token(email)}"))
    if asserted is not None:
        md.append(("x-goog-user-email", asserted))
    return md


@pytest.fixture
def as_alice(fresh_email: Callable[[str], str]) -> list[tuple[str, str]]:
    """Alice's call metadata (a fresh alice per test, so buckets start full)."""
    email = fresh_email("alice")
    return metadata_for(email, email)
