"""Fixtures for the actuator: the simulator through the real client, real Celery workers.

* ``api_cluster``: the session's API-only simulator (no controllers: nothing but
  the actuator changes JobSets, see tests/fixtures/simulators.py); every test
  points the real ``kubernetes`` client at it.
* ``workers``: ``celery -A xmc worker -Q actuator`` subprocesses (tests/celery_workers.py)
  against the test database and the test's Redis db, stopped at teardown.
* ``real_deliver``: undo the suite-wide stand-in for ``outbox.deliver_committed`` so
  committed operations really reach the broker.
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from jobsets.contract import FINALIZER, jobset_name
from k8s_bridge import client
from simulators.cluster.server import SimulatorHandle
from tests.fixtures.simulators import NAMESPACE
from workunits.outbox import deliver as REAL_DELIVER
from tests.celery_workers import CeleryWorkers
from workunits.outbox import deliver_committed as REAL_DELIVER_COMMITTED


@pytest.fixture
def real_deliver(_no_outbox_delivery: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workunits.outbox.deliver_committed", REAL_DELIVER_COMMITTED)
    monkeypatch.setattr("workunits.outbox.deliver", REAL_DELIVER)


def get_jobset(sim: SimulatorHandle, xid: int, wid: int) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = sim.store.get("jobsets", NAMESPACE, jobset_name(xid, wid))
        return obj
    except Exception as exc:
        if getattr(exc, "code", None) == 404:
            return None
        raise


def release_finalizer(sim: SimulatorHandle, xid: int, wid: int) -> None:
    """Do what the reconciler's finalizer path does last: remove our finalizer."""
    obj = get_jobset(sim, xid, wid)
    if obj is not None and FINALIZER in (obj["metadata"].get("finalizers") or []):
        client.custom_objects().patch_namespaced_custom_object(
            client.JOBSET_GROUP, client.JOBSET_VERSION, NAMESPACE, client.JOBSET_PLURAL, jobset_name(xid, wid),
            {"metadata": {"finalizers": None}},
        )


class Workers:
    """``celery -A xmc worker -Q actuator`` processes for one test (``tests.celery_workers``),
    pointed at the simulator, with short actuator backoffs."""

    def __init__(self, workers: CeleryWorkers, broker: str, kubeconfig: str) -> None:
        self.workers = workers
        self.broker = broker
        self.kubeconfig = kubeconfig

    def start(self, *, concurrency: int = 2, beat: bool = False, broker: str | None = None,
              **env_overrides: str) -> subprocess.Popen[bytes]:
        env = {
            "REDIS_URL": broker or self.broker,
            "CELERY_BROKER_URL": broker or self.broker,
            "KUBECONFIG": self.kubeconfig,
            "XMC_K8S_NAMESPACE": NAMESPACE,
            "XMC_ACTUATOR_BACKOFF_BASE_S": "0.1",
            "XMC_ACTUATOR_BACKOFF_MAX_S": "1",
            "XMC_LOG_LEVEL": "INFO",
            **env_overrides,
        }
        return self.workers.start("actuator", pool="prefork", concurrency=concurrency, beat=beat, env=env)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        self.workers.kill(proc)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        self.workers.stop(proc)

    def logs(self) -> str:
        return self.workers.logs()


@pytest.fixture
def workers(api_cluster: SimulatorHandle, real_deliver: None, celery_workers: CeleryWorkers) -> Iterator[Workers]:
    broker = settings.CELERY_BROKER_URL
    redis.Redis.from_url(broker).flushdb()  # this test's Redis db only
    yield Workers(celery_workers, broker, str(api_cluster.kubeconfig_path))
    celery_workers.stop_all()
    redis.Redis.from_url(broker).flushdb()


@pytest.fixture
def worker(workers: Workers) -> subprocess.Popen[bytes]:
    """One running worker (2 processes)."""
    return workers.start()
