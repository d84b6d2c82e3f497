"""RPCs skip Django's per-request ``SELECT 1`` health check; broken connections still get closed."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest
from django.db import OperationalError, connection, connections

from core import pb
from tests.api.grpc_server.conftest import metadata_for
from xmc.api import grpc_server
from xmc.api.grpc_server import build_server, shutdown

pytestmark = pytest.mark.django_db(transaction=True)
api = pb.api


@pytest.fixture
def usability_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Every ``is_usable`` (the health check query) run on this thread's connection, and its answer."""
    seen: list[bool] = []
    wrapper = type(connections["default"])
    real = wrapper.is_usable

    def counting(self: Any) -> bool:
        usable: bool = real(self)
        seen.append(usable)
        return usable

    monkeypatch.setattr(wrapper, "is_usable", counting)
    yield seen


def _wrapped(body: Any) -> Any:
    handler = grpc.unary_unary_rpc_method_handler(body)
    return grpc_server._with_connection_care(handler).unary_unary


def test_it_runs_an_rpc_on_a_live_connection_without_a_health_check(usability_checks: list[bool]) -> None:
    assert connection.settings_dict["CONN_HEALTH_CHECKS"] is True  # REST keeps it
    connection.ensure_connection()

    def body(request: Any, context: Any) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 41 + 1")
            return int(cursor.fetchone()[0])

    assert _wrapped(body)(None, None) == 42
    assert usability_checks == []
    # The same connection with the per-request check Django runs for REST: one SELECT 1.
    connection.close_if_unusable_or_obsolete()
    body(None, None)
    assert usability_checks == [True]


def test_it_closes_a_connection_that_broke_during_an_rpc(usability_checks: list[bool]) -> None:
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    params = {**connection.get_connection_params(), "dbname": "postgres"}

    def body(request: Any, context: Any) -> None:
        with psycopg.connect(**params, autocommit=True) as killer:
            # pg_terminate_backend only signals; wait for the backend to be gone (under load it can
            # still answer one more query), bounded by a 5 s timeout in the server itself.
            killer.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
        with pytest.raises(OperationalError), connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    _wrapped(body)(None, None)
    assert usability_checks == [False]  # checked after the RPC because it failed ...
    assert connection.connection is None  # ... and closed, so the next RPC reconnects


def test_it_serves_again_after_the_database_dropped_every_server_connection() -> None:
    server, port = build_server(0, 2, host="127.0.0.1")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            ess = pb.api_grpc.ExperimentStateServiceStub(channel)
            md = metadata_for("alice@example.com")
            created = ess.CreateExperiment(api.CreateExperimentRequest(), metadata=md, timeout=20)
            for _ in range(4):
                ess.GetExperiment(api.GetExperimentRequest(name=created.name), metadata=md, timeout=20)
            params = {**connection.get_connection_params(), "dbname": "postgres"}
            with psycopg.connect(**params, autocommit=True) as killer:
                killer.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                    [connection.settings_dict["NAME"], connection.cursor().connection.info.backend_pid],
                )
            codes = []
            for _ in range(10):  # each of the 2 workers may fail once, then reconnects
                try:
                    ess.GetExperiment(api.GetExperimentRequest(name=created.name), metadata=md, timeout=20)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())
            assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
            assert codes.count(grpc.StatusCode.UNAVAILABLE) <= 2, codes
            assert codes.count(grpc.StatusCode.OK) >= 8, codes
    finally:
        shutdown(server, grace_s=1)
