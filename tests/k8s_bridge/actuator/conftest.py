"""Fixtures for the actuator: the simulator through the real client, real Celery workers.

* ``cluster``: the session's API-only simulator (no controllers: nothing but
  the actuator changes JobSets, see tests/simulators/fixtures.py); every test
  points the real ``kubernetes`` client at it.
* ``start_worker``: ``celery -A xmc worker -Q actuator`` subprocesses against
  the test database and the test's Redis db, killed at teardown.
* ``real_deliver``: undo the suite-wide stand-in for ``outbox.deliver_committed`` so
  committed operations really reach the broker.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from jobsets.contract import FINALIZER, jobset_name
from k8s_bridge import client
from simulators.cluster.server import SimulatorHandle
from tests.simulators.fixtures import NAMESPACE
from workunits.outbox import deliver as REAL_DELIVER
from tests.childenv import child_database_url
from workunits.outbox import deliver_committed as REAL_DELIVER_COMMITTED

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def cluster(api_cluster: SimulatorHandle) -> SimulatorHandle:
    """The session's API-only simulator (tests/simulators/fixtures.py), the real client pointed at it."""
    return api_cluster


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
    """Start and stop ``celery -A xmc worker`` processes for one test."""

    def __init__(self, broker: str, kubeconfig: str, log_dir: Path) -> None:
        self.broker = broker
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *, concurrency: int = 2, beat: bool = False, broker: str | None = None,
              **env_overrides: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update({
            "DATABASE_URL": child_database_url(),
            "REDIS_URL": broker or self.broker,
            "CELERY_BROKER_URL": broker or self.broker,
            "KUBECONFIG": self.kubeconfig,
            "XMC_K8S_NAMESPACE": NAMESPACE,
            "XMC_TASK_SIGNING_KEY": settings.XMC_TASK_SIGNING_KEY,
            "XMC_TASK_SIGNING_KEY_ID": settings.XMC_TASK_SIGNING_KEY_ID,
            "XMC_ACTUATOR_BACKOFF_BASE_S": "0.1",
            "XMC_ACTUATOR_BACKOFF_MAX_S": "1",
            "XMC_DB_CONN_MAX_AGE": "0",
            "XMC_LOG_LEVEL": "INFO",
        })
        env.update(env_overrides)
        argv = [sys.executable, "-m", "celery", "-A", "xmc", "worker", "-Q", "actuator",
                "--concurrency", str(concurrency), "--pool", "prefork", "--loglevel", "INFO",
                "-n", f"act-{uuid.uuid4().hex[:8]}@%h", "--without-gossip", "--without-mingle",
                "--without-heartbeat"]
        if beat:
            argv += ["-B", "-s", str(self.log_dir / f"beat-{uuid.uuid4().hex[:6]}")]
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "ab")  # noqa: SIM115 - child's lifetime
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and its pool children (no warm shutdown, nothing given back)."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs:
            self.stop(proc)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(self.log_dir.glob("worker-*.log")))


@pytest.fixture
def workers(cluster: SimulatorHandle, real_deliver: None, tmp_path: Path) -> Iterator[Workers]:
    broker = settings.CELERY_BROKER_URL
    redis.Redis.from_url(broker).flushdb()  # this test's Redis db only
    w = Workers(broker, str(cluster.kubeconfig_path), tmp_path)
    yield w
    w.stop_all()
    print(w.logs())  # shown when the test failed
    redis.Redis.from_url(broker).flushdb()


@pytest.fixture
def worker(workers: Workers) -> subprocess.Popen[bytes]:
    """One running worker (2 processes)."""
    return workers.start()
