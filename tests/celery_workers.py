"""The one way a test starts a real ``celery -A xmc worker`` process.

Every worker a test starts is a child on the test database (``child_database_url``)
and this xdist worker's broker (``settings.CELERY_BROKER_URL``, its own Redis
database — see ``tests/workers.py``), with the signing keys this process signs
with, in a process group of its own (so SIGTERM and SIGKILL reach the pool's
children), logging to a file of its own under the test's ``tmp_path``. The
``celery_workers`` fixture stops whatever is still running when the test ends
(SIGTERM, then SIGKILL after 30 s) and prints the logs' tails, which pytest
shows when the test failed.

Options differ by what the test is about (the queue, the pool, a beat, the
settings the consumer reads); the way to start, log, stop and kill does not.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from django.conf import settings

from tests.childenv import child_database_url

ROOT = Path(__file__).resolve().parents[1]


def worker_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker (or any process) a test starts on the suite's services."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "xmc.settings",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": child_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        # The workers verify what this process signs, and decrypt what it encrypted.
        "XMC_TASK_SIGNING_KEY": settings.XMC_TASK_SIGNING_KEY,
        "XMC_TASK_SIGNING_KEY_ID": settings.XMC_TASK_SIGNING_KEY_ID,
        "XMC_SECRET_KEY": settings.SECRET_KEY,
        "XMC_DB_CONN_MAX_AGE": "0",
    }
    env.update(overrides or {})
    return env


class CeleryWorkers:
    """Start, stop and kill ``celery -A xmc worker`` processes for one test."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: dict[int, Path] = {}

    def start(self, queues: str, *, pool: str = "solo", concurrency: int = 1, beat: bool = False,
              loglevel: str = "INFO", env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """One worker consuming ``queues`` (comma-separated), started now; it is ready when it consumes."""
        tag = uuid.uuid4().hex[:8]
        argv = [sys.executable, "-m", "celery", "-A", "xmc", "worker", "-Q", queues, "--pool", pool,
                "--loglevel", loglevel, "-n", f"test-{tag}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]
        if pool != "solo":
            argv += ["--concurrency", str(concurrency)]
        if beat:
            argv += ["-B", "-s", str(self.log_dir / f"beat-{tag}")]
        log = self.log_dir / f"worker-{len(self.procs)}.log"
        with log.open("ab") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, cwd=ROOT, env=worker_env(env), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append(proc)
        self._logs[proc.pid] = log
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and its pool children: no warm shutdown, nothing given back."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM (a warm shutdown), then SIGKILL if it has not ended within 30 s."""
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

    def log_path(self, proc: subprocess.Popen[bytes]) -> Path:
        return self._logs[proc.pid]

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        """What one worker has written so far."""
        return self.log_path(proc).read_text(errors="replace")

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(self.log(p)[-tail:] for p in self.procs)


@pytest.fixture
def celery_workers(tmp_path: Path) -> Iterator[CeleryWorkers]:
    workers = CeleryWorkers(tmp_path)
    try:
        yield workers
    finally:
        workers.stop_all()
        print(workers.logs())  # shown when the test failed
