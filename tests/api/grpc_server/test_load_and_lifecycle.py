"""The server under load and across its life: bounded database connections, graceful stop, the command.

Connections are counted the way an operator would, in ``pg_stat_activity``
for the test database, by a sampler with its own connection to the
``postgres`` maintenance database (so it never counts itself).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from django.db import connection, connections
from grpc_health.v1 import health_pb2, health_pb2_grpc

from core import pb
from tests.api.grpc_server.conftest import MAX_WORKERS, metadata_for
from tests.childenv import child_database_url
from xmc.api import registry
from xmc.api.grpc_server import ESS, build_server, shutdown, stop_gracefully

api = pb.api
ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.django_db(transaction=True)


class ConnectionSampler:
    """Counts the backends connected to the test database, every 10 ms, in a thread."""

    def __init__(self) -> None:
        params = connection.get_connection_params()
        self.database = connection.settings_dict["NAME"]
        params["dbname"] = "postgres"
        self._conn = psycopg.connect(**params, autocommit=True)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int:
        row = self._conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [self.database]
        ).fetchone()
        assert row is not None
        return int(row[0])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.count())
            time.sleep(0.01)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def terminate_others(self, keep_pid: int) -> None:
        """End every backend on the test database except ``keep_pid`` (the test's own)."""
        self._conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
            [self.database, keep_pid],
        )

    def close(self) -> None:
        self._conn.close()


@pytest.fixture
def sampler() -> Iterator[ConnectionSampler]:
    s = ConnectionSampler()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=[0, 600], ids=["per-rpc-connections", "persistent-connections"])
def load_server(request: pytest.FixtureRequest, sampler: ConnectionSampler) -> Iterator[tuple[Any, int]]:
    """A server of its own with ``MAX_WORKERS`` threads, and the CONN_MAX_AGE it runs with.

    Every thread's connection reads the one shared settings dict, so setting
    CONN_MAX_AGE there reaches the server's threads.
    """
    conn_max_age: int = request.param
    shared = connections.settings["default"]
    before = shared["CONN_MAX_AGE"]
    shared["CONN_MAX_AGE"] = conn_max_age
    server, port = build_server(0, MAX_WORKERS, host="127.0.0.1")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb.api_grpc.ExperimentStateServiceStub(channel), conn_max_age
    finally:
        shutdown(server, grace_s=1)  # ends the threads that held the connections
        shared["CONN_MAX_AGE"] = before
        # Belt and braces: no backend of the ended threads may outlive the test
        # (it would block dropping the test database).
        sampler.terminate_others(connection.cursor().connection.info.backend_pid)


def _hammer(ess: Any, emails: list[str], xid_name: str, calls: int) -> list[grpc.StatusCode]:
    """``calls`` RPCs in flight at once, spread over ``emails``; their status codes."""
    metadatas = [metadata_for(email, email) for email in emails]
    futures = []
    for i in range(calls):
        md = metadatas[i % len(metadatas)]
        if i % 2:
            futures.append(ess.GetExperiment.future(api.GetExperimentRequest(name=xid_name), metadata=md, timeout=60))
        else:
            futures.append(
                ess.SearchWorkUnits.future(api.ListWorkUnitsRequest(parent=xid_name), metadata=md, timeout=60)
            )
    codes = []
    for future in futures:
        try:
            future.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    return codes


def _shared_experiment(ess: Any, owner: str, readers: list[str]) -> str:
    acls = pb.xid.XidAcls(
        owners=[pb.xid.XidAcls.Role(user=owner)], readers=[pb.xid.XidAcls.Role(user=r) for r in readers]
    )
    created = ess.CreateExperiment(
        api.CreateExperimentRequest(experiment=pb.experiment.Experiment(title="load", acls=acls)),
        metadata=metadata_for(owner),
        timeout=10,
    )
    return str(created.name)


def test_it_holds_at_most_one_database_connection_per_worker_under_200_concurrent_calls(
    load_server: tuple[Any, int], sampler: ConnectionSampler, fresh_email: Callable[[str], str]
) -> None:
    ess, conn_max_age = load_server
    emails = [fresh_email(f"load{i}") for i in range(5)]  # 40 calls each: well under one bucket's burst
    xid_name = _shared_experiment(ess, emails[0], emails[1:])
    baseline = sampler.count()  # this test's own connection

    with sampler:
        codes = _hammer(ess, emails, xid_name, calls=200)

    assert codes == [grpc.StatusCode.OK] * 200
    assert max(sampler.samples) > baseline  # the sampler did see the server working
    if conn_max_age:
        # One connection per worker thread, reused from call to call, never more.
        assert max(sampler.samples) - baseline <= MAX_WORKERS
        assert sampler.count() - baseline <= MAX_WORKERS
    else:
        # A new connection per RPC. A closed connection's backend takes a moment
        # to exit, so a worker may briefly show its old backend beside its new
        # one: at most two per worker, and nothing outlives the load.
        assert max(sampler.samples) - baseline <= 2 * MAX_WORKERS
        deadline = time.monotonic() + 5
        while sampler.count() > baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        # At most the baseline: a connection an earlier test of this worker left may close meanwhile.
        assert sampler.count() <= baseline


# --- Graceful stop ---------------------------------------------------------------------------


@pytest.fixture
def slow_status(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """GetExperimentStatus takes a second; the event is set when a call has started."""
    started = threading.Event()
    rpc = registry.RPCS[(ESS, "GetExperimentStatus")]

    def slow(request: Any, caller: registry.Caller) -> Any:
        started.set()
        time.sleep(1.0)
        return pb.status.ExperimentStatus()

    monkeypatch.setitem(registry.RPCS, (ESS, "GetExperimentStatus"), registry.Rpc(ESS, rpc.method, rpc.request, rpc.response, slow))
    return started


def test_it_finishes_running_calls_and_reports_not_serving_when_stopped(
    slow_status: threading.Event, fresh_email: Callable[[str], str]
) -> None:
    server, port = build_server(0, 2, host="127.0.0.1")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        ess = pb.api_grpc.ExperimentStateServiceStub(channel)
        health_updates = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=ESS), timeout=20
        )
        assert next(health_updates).status == health_pb2.HealthCheckResponse.SERVING
        in_flight = ess.GetExperimentStatus.future(
            api.GetExperimentStatusRequest(name="experiments/1"), metadata=metadata_for(fresh_email("bob")), timeout=20
        )
        assert slow_status.wait(10)

        stopped = stop_gracefully(server, grace_s=10)

        assert next(health_updates).status == health_pb2.HealthCheckResponse.NOT_SERVING
        health_updates.cancel()  # a watcher would hold the server for the whole grace period
        assert in_flight.result() == pb.status.ExperimentStatus()  # finished, not cut off
        with pytest.raises(grpc.RpcError) as refused:
            ess.GetExperimentStatus(
                api.GetExperimentStatusRequest(name="experiments/1"), metadata=metadata_for("bob@example.com"), timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert stopped.wait(5)
    shutdown(server, grace_s=0)


# --- manage.py grpcserver ----------------------------------------------------------------------


def test_it_runs_as_a_command_that_prints_its_address_and_stops_on_sigterm() -> None:
    # The suite's own test database: DATABASE_URL may name one that does not exist (its test_
    # copy is what pytest made), and the health service says NOT_SERVING without a database.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DATABASE_URL": child_database_url()}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "grpcserver", "--port", "0", "--host", "127.0.0.1", "--grace", "2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first_line = proc.stdout.readline().strip()
        assert first_line.startswith("gRPC server listening on 127.0.0.1:"), first_line + proc.stderr.read()
        port = int(first_line.rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=ESS), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "gRPC server stopped" in out
    assert "grpc.stopping signal=SIGTERM" in err


def test_it_refuses_to_start_on_a_port_another_server_already_serves(grpc_server: tuple[Any, int]) -> None:
    # Without this, SO_REUSEPORT would let two servers split one port's traffic.
    with pytest.raises(OSError, match="could not bind"):
        build_server(grpc_server[1], 1, host="127.0.0.1")


def test_it_says_so_when_the_command_cannot_listen(grpc_server: tuple[Any, int]) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "grpcserver", "--port", str(grpc_server[1]), "--host", "127.0.0.1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"could not bind the gRPC server to 127.0.0.1:{grpc_server[1]}" in done.stderr


def test_it_shares_a_port_between_processes_only_when_asked() -> None:
    first, port = build_server(0, 1, host="127.0.0.1", reuse_port=True)
    try:
        second, same_port = build_server(port, 1, host="127.0.0.1", reuse_port=True)
        assert same_port == port
        shutdown(second, grace_s=0)
    finally:
        shutdown(first, grace_s=0)
