"""The whole system as ``./dev run`` starts it, for end-to-end tests.

`system` (module scope) runs ``scripts/run_all.py`` in a private run folder
on free ports, pointed at the *test* database pytest-django created (so the
tests read what the processes wrote through the ORM) and at the suite's
Redis. It waits for the "stops everything" line, parses the ``export``
lines, and on teardown sends SIGTERM (run_all stops every child) and kills
the process group if anything is left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests import waiting
from tests.childenv import child_database_url
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class System:
    exports: dict[str, str]
    run_dir: Path
    output: list[str]

    @property
    def api(self) -> str:
        return self.exports["XMC_API_URL"]

    def log(self, name: str) -> str:
        path = self.run_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def system(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory,
           request: pytest.FixtureRequest) -> Iterator[System]:
    with django_db_blocker.unblock():
        database_url = child_database_url()
    run_dir = tmp_path_factory.mktemp("run")
    extra: dict[str, str] = getattr(request.module, "SYSTEM_ENV", {})
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "XMC_RUN_DIR": str(run_dir),
        "XMC_WEB_PORT": str(free_port()),
        "XMC_SIM_PORT": str(free_port()),
        "XMC_GRPC_PORT": str(free_port()),
        "XMC_MLRUN_EMULATOR_PORT": str(free_port()),
        "XMC_RECONCILER_METRICS_PORT": str(free_port()),
        **extra,
    }
    env.pop("XMC_MLRUN_ENDPOINT", None)
    # The URLs above are explicit: run_all must write them into the run folder's env file.
    env.pop("XMC_DEV_EMBEDDED_PG", None)
    env.pop("XMC_DEV_EMBEDDED_REDIS", None)
    # Tasks other tests left in this run's Redis database must not reach this system's worker.
    redis.Redis.from_url(env.get("REDIS_URL", "redis://127.0.0.1:6379/0")).flushdb()
    proc = subprocess.Popen([sys.executable, "scripts/run_all.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output: list[str] = []
    try:
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise AssertionError("run_all exited:\n" + "".join(output))
            output.append(line)
            if "stops everything" in line:
                break
        else:
            raise AssertionError("run_all never became ready:\n" + "".join(output))
        exports = {}
        for line in output:
            if line.startswith("export "):
                key, value = line[len("export "):].strip().split("=", 1)
                exports[key] = value.strip("'")
        yield System(exports, run_dir, output)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def eventually(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.5) -> Any:
    """`tests.waiting.eventually`, polled every half second (each check reads the database or the API)."""
    return waiting.eventually(check, timeout, what, interval=interval)
