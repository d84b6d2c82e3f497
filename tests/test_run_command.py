"""The README's run command: every process starts, answers, and goes away.

``./dev run`` is what a new user meets first; these tests run it as they
would, in a private run folder and on free ports.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ports_env(run_dir: Path) -> dict[str, str]:
    return {
        "XMC_RUN_DIR": str(run_dir),
        "XMC_WEB_PORT": str(_free_port()),
        "XMC_SIM_PORT": str(_free_port()),
        "XMC_GRPC_PORT": str(_free_port()),
        "XMC_MLRUN_EMULATOR_PORT": str(_free_port()),
        "XMC_RECONCILER_METRICS_PORT": str(_free_port()),
    }


def test_it_starts_every_process_and_stops_them(tmp_path: Path) -> None:
    env = {**os.environ, **_ports_env(tmp_path)}
    result = subprocess.run([sys.executable, "scripts/run_all.py", "--smoke"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("web", "simulator", "grpc", "mlrun", "worker", "beat", "reconciler"):
        assert f"run: {name}" in result.stdout
    for line in ("export XMANAGER_ENDPOINT=", "export XMC_AUTH_TOKEN=", "export XMC_API_URL=", "export KUBECONFIG="):
        assert line in result.stdout


def _wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float) -> str:
    seen = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"{needle!r} never printed:\n{''.join(seen)}")


def _get(url: str) -> tuple[int, bytes, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read(), response.headers.get("Content-Type", "")


@pytest.mark.timeout(420)
def test_it_runs_on_embedded_services_and_goes_away_on_sigterm(tmp_path: Path) -> None:
    # A fresh machine: no services and no secret key configured.
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "XMC_SECRET_KEY")}
    env.update(_ports_env(tmp_path))
    env["XMC_EMBEDDED_REDIS_PORT"] = str(_free_port())
    proc = subprocess.Popen(["./dev", "run"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out = _wait_for_line(proc, "stops everything", timeout=300)
        started = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        api = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("export XMC_API_URL="))

        # The admin is styled: its CSS is served outside debug.
        status, body, ctype = _get(f"{api}/static/admin/css/base.css")
        assert status == 200 and "text/css" in ctype and b"body" in body
        # A management command reaches the same database as the running system.
        manage = subprocess.run(
            ["./dev", "manage", "shell", "-c",
             "from django.contrib.auth.models import User; print(User.objects.filter(is_staff=True).count())"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert manage.returncode == 0, manage.stderr
        assert manage.stdout.strip().splitlines()[-1] == "1"

        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    survivors = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert survivors == [], [psutil.Process(p).cmdline() for p in survivors]
    # The embedded Postgres and Redis it started are gone too; their data stays.
    assert not (tmp_path / "pg" / "postmaster.pid").exists()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(env["XMC_EMBEDDED_REDIS_PORT"]))) != 0
    assert (tmp_path / "secret_key").exists() and (tmp_path / "env").exists()
