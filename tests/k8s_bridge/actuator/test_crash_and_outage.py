"""Crash safety and broker outages: nothing committed is lost or done twice.

* A worker SIGKILLed in the middle of 200 creates: the messages it held come
  back (Redis visibility timeout) to a new worker; every operation ends done
  once, one JobSet per work unit.
* Redis down while a create commits: the publish fails, the row stays in the
  outbox (no ``dispatched_time``), repeated failures put a FATAL message on the
  execution, and once Redis is back the beat sweep carries the create out.
  This test runs its own ``redis-server`` on a free port (never the shared one).
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import close_old_connections
from kombu import pools as kombu_pools

from jobsets.contract import LABEL_EID
from tests import factories
from tests.k8s_bridge.actuator.conftest import NAMESPACE, REAL_DELIVER, Workers, get_jobset
from tests.waiting import eventually
from workunits import services
from workunits.models import DeadLetter, Operation, WorkUnitExecution
from xmc.celery import app

pytestmark = pytest.mark.django_db(transaction=True)

VISIBILITY_S = 4


def test_it_survives_a_worker_killed_in_the_middle_of_200_creates(workers: Workers, cluster: Any) -> None:
    first = workers.start(concurrency=2, XMC_CELERY_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S))
    exp = factories.experiment()
    ops = [services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(200)]

    def done_count() -> int:
        close_old_connections()
        return Operation.objects.filter(id__in=ops, done=True).count()

    eventually(lambda: done_count() >= 20, timeout=120, what="the first creates")
    workers.kill(first)
    killed_at = done_count()
    assert killed_at < 200, "the batch finished before the kill; nothing was tested"
    time.sleep(VISIBILITY_S + 1)  # let the dead worker's reservations become visible again
    workers.start(concurrency=2, XMC_CELERY_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S))
    eventually(lambda: done_count() == 200, timeout=240, what="all 200 creates")

    finished = Operation.objects.filter(id__in=ops)
    assert all(op.error is None and op.end_time is not None for op in finished)
    assert not DeadLetter.objects.exists()
    jobsets = [j for j in cluster.store.list("jobsets", NAMESPACE)[0]
               if j["metadata"]["labels"].get("xmc.google.com/xid") == str(exp.id)]
    names = sorted(j["metadata"]["name"] for j in jobsets)
    assert names == sorted(f"xmc-{exp.id}-{wid}" for wid in range(1, 201))
    assert {j["metadata"]["labels"][LABEL_EID] for j in jobsets} == {"1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    def __init__(self, port: int, workdir: str) -> None:
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed for this test"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


@pytest.fixture
def private_redis(tmp_path: Any) -> Iterator[PrivateRedis]:
    r = PrivateRedis(_free_port(), str(tmp_path))
    r.start()
    yield r
    r.stop()


def _use_broker(url: str | None, write_url: str | None) -> None:
    """Point this process's Celery producer at ``url`` (the worker gets it by env)."""
    app.pool.force_close_all()
    app.conf.broker_url = url
    app.conf.broker_write_url = write_url
    app._pool = None
    app.amqp._producer_pool = None
    kombu_pools.reset()  # the global producer pools keyed by connection


@pytest.fixture
def private_broker(private_redis: PrivateRedis) -> Iterator[PrivateRedis]:
    old = (app.conf.broker_url, app.conf.broker_write_url)
    _use_broker(private_redis.url, private_redis.url)
    yield private_redis
    _use_broker(*old)


def test_it_carries_out_a_create_committed_while_redis_was_down(
    workers: Workers, cluster: Any, private_broker: PrivateRedis, settings: Any
) -> None:
    exp = factories.experiment()
    private_broker.stop()
    op = services.create_work_unit(exp.id, factories.work_unit_message())  # on commit: publish fails
    row = Operation.objects.get(id=op.id)
    assert row.dispatched_time is None and row.dispatch_attempts == 1 and not row.done

    # The sweep's next tries fail too: the execution is told, FATAL for a create.
    for _ in range(settings.XMC_OUTBOX_FAILURES_BEFORE_MESSAGE - 1):
        REAL_DELIVER([op.id])
    ex = WorkUnitExecution.objects.get(work_unit_id=op.work_unit_id, eid=1)
    assert ex.system_message["severity"] == "FATAL"
    assert "actuator" in ex.system_message["userFacingText"]

    private_broker.start()
    workers.start(concurrency=1, beat=True, broker=private_broker.url,
                  XMC_OUTBOX_SWEEP_INTERVAL_S="1", XMC_OUTBOX_SWEEP_MIN_AGE_S="0")

    def finished() -> Operation | None:
        close_old_connections()
        row = Operation.objects.get(id=op.id)
        return row if row.done else None

    done = eventually(finished, timeout=120, what="the swept create")
    assert done.error is None and done.dispatched_time is not None
    assert get_jobset(cluster, exp.id, 1) is not None
