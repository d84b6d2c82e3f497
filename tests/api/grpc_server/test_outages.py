"""The gRPC edge while Postgres or Redis is down: fast, clear answers, and back by itself.

* Postgres refusing connections, or stalled (accepting and never answering):
  every call answers UNAVAILABLE within a few seconds (never INTERNAL, never
  a hang), the health service says NOT_SERVING, and once the database is
  back the same server answers again (no restart).
* Redis down: CreateWorkUnit still commits and answers OK (the outbox keeps
  the operation for the sweep), and rate limiting lets calls through.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kombu import pools as kombu_pools

from tests.k8s_bridge.actuator.conftest import REAL_DELIVER_COMMITTED  # imported before any test patches it
from tests.api.grpc_server.conftest import metadata_for
from tests.workunits.delivery.outages import database_down
from tests.ports import free_port
from tests.waiting import eventually
from workunits.models import Operation
from core import pb
from xmc.api.grpc_server import close_worker_connections, watch_database_health
from xmc.celery import app

pytestmark = pytest.mark.django_db(transaction=True)
api = pb.api


@pytest.fixture
def health_watch(grpc_server: tuple[grpc.Server, int]) -> Iterator[None]:
    stop = watch_database_health(grpc_server[0], interval_s=0.2)
    yield
    stop.set()
    time.sleep(0.3)


def _create_request(parent: str) -> Any:
    job = pb.work_unit.KubernetesJob(
        name="t", replicas=1,
        spec=pb.work_unit.ExecutableSpec(docker_image="gcr.io/proj/t:v1", resources=pb.resources.ResourceSet(
            cpu_resources=pb.resources.CpuResources(cpu_millicores=1000, memory_bytes=2**30))))
    return api.CreateWorkUnitRequest(parent=parent, work_unit=pb.work_unit.WorkUnit(
        executable=pb.work_unit.Executable(jobset=pb.work_unit.JobSetExecutable(jobs=[job]))))


@pytest.mark.parametrize("mode", ["refused", "stalled"])
def test_it_answers_calls_unavailable_fast_and_health_says_not_serving_while_postgres_is_down(
    ess: Any, channel: grpc.Channel, grpc_server: tuple[grpc.Server, int], health_watch: None,
    fresh_email: Any, settings: Any, mode: str,
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    md = metadata_for(fresh_email("alice"))
    experiment = ess.CreateExperiment(api.CreateExperimentRequest(), metadata=md, timeout=20)
    bob = metadata_for(fresh_email("bob"))  # a caller the server has not seen (no identity cached)
    close_worker_connections(grpc_server[0])
    with database_down(mode):
        close_worker_connections(grpc_server[0])
        for call in (lambda: ess.GetExperiment(api.GetExperimentRequest(name=experiment.name), metadata=md,
                                               timeout=30),
                     lambda: ess.CreateWorkUnit(_create_request(experiment.name), metadata=md, timeout=30),
                     lambda: ess.CreateExperiment(api.CreateExperimentRequest(), metadata=bob, timeout=30)):
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as failed:
                call()
            took = time.monotonic() - started
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()
            assert took < settings.XMC_DB_CONNECT_TIMEOUT_S + 3, f"{took:.1f} s"
        eventually(lambda: health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
                   == health_pb2.HealthCheckResponse.NOT_SERVING, timeout=20, what="NOT_SERVING")
    # Back by itself: the same server, no restart.
    eventually(lambda: health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
               == health_pb2.HealthCheckResponse.SERVING, timeout=20, what="SERVING again")
    got = eventually(lambda: ess.GetExperiment(api.GetExperimentRequest(name=experiment.name), metadata=md,
                                               timeout=10), timeout=20, what="an answer again",
                     retry_on=(grpc.RpcError,))
    assert got.name == experiment.name


def _use_broker(url: str | None) -> None:
    app.pool.force_close_all()
    app.conf.broker_url = url
    app.conf.broker_write_url = url
    app._pool = None
    app.amqp._producer_pool = None
    kombu_pools.reset()


def test_it_commits_a_create_and_answers_ok_while_redis_is_down(
    ess: Any, fresh_email: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setattr("workunits.outbox.deliver_committed", REAL_DELIVER_COMMITTED)  # really publish

    md = metadata_for(fresh_email("alice"))
    experiment = ess.CreateExperiment(api.CreateExperimentRequest(), metadata=md, timeout=20)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    old = app.conf.broker_url
    settings.XMC_RATE_LIMIT_PER_S = 5.0  # limiting on, against a dead Redis: it fails open
    settings.REDIS_URL = dead
    _use_broker(dead)
    try:
        started = time.monotonic()
        created = ess.CreateWorkUnit(_create_request(experiment.name), metadata=md, timeout=30)
        took = time.monotonic() - started
        op_id = int(created.name.rsplit("/", 1)[1])
        # The hand-over after commit failed: the operation waits in the outbox, for the sweep.
        op = eventually(lambda: Operation.objects.filter(id=op_id, dispatch_attempts__gte=1).first(), timeout=20,
                        what="the failed hand-over counted")
    finally:
        _use_broker(old)
    assert took < 10, f"{took:.1f} s"
    assert not op.done and op.dispatched_time is None
    assert any("ratelimit" in r.name and r.levelname in ("WARNING", "ERROR") for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
