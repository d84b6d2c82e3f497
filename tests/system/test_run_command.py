"""The README's run command: every process starts, answers, and goes away.

``./dev run`` is what a new user meets first; these tests run it as they
would, in a private run folder and on free ports.
"""
from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest
from tests.fixtures.systems import ports_env
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _fresh_machine_env(run_dir: Path) -> dict[str, str]:
    """The environment of a new user: no services, no secret key, a run folder and ports of its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "XMC_SECRET_KEY", "XMC_DEV_EMBEDDED_PG", "XMC_DEV_EMBEDDED_REDIS")}
    env.update(ports_env(run_dir))
    env["XMC_EMBEDDED_REDIS_PORT"] = str(free_port())
    return env


def _redis_answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _suite_services_answer() -> None:
    """The database and Redis this test run itself uses are still up."""
    import redis
    from django.conf import settings

    assert redis.Redis.from_url(settings.REDIS_URL).ping()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


@pytest.mark.django_db
@pytest.mark.timeout(300)
def test_it_starts_every_process_and_stops_them_with_the_services_it_started(machine_tmp: Path) -> None:
    env = _fresh_machine_env(machine_tmp)
    result = subprocess.run(["./dev", "run", "--smoke"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("web", "simulator", "grpc", "mlrun", "worker", "beat", "reconciler"):
        assert f"run: {name}" in result.stdout
    # Debian's Prometheus for the system metrics, where it is installed (./dev installs it), else one line.
    assert ("run: prometheus" in result.stdout if shutil.which("prometheus")
            else "system metrics are off" in result.stdout + result.stderr)
    for line in ("export XMANAGER_ENDPOINT=", "export XMC_AUTH_TOKEN=", "export XMC_API_URL=", "export KUBECONFIG=",
                 "export XMANAGER_DASHBOARD_ENDPOINT=127.0.0.1:", "export XMC_DASHBOARD_ENDPOINT=127.0.0.1:",
                 "export XMANAGER_UI_URL="):
        assert line in result.stdout
    # It stopped the Postgres and Redis it started for itself ...
    assert not (machine_tmp / "pg" / "postmaster.pid").exists()
    assert not _redis_answers(int(env["XMC_EMBEDDED_REDIS_PORT"]))
    # ... and nothing of the test run's own.
    _suite_services_answer()


@pytest.mark.timeout(300)
def test_it_leaves_alone_the_services_it_found_running(machine_tmp: Path) -> None:
    # As when `./dev test` (or another run) already uses this run folder's services.
    env = _fresh_machine_env(machine_tmp)
    port = env["XMC_EMBEDDED_REDIS_PORT"]
    script = [sys.executable, "scripts/devservices.py"]
    try:
        for args in (["postgres", str(machine_tmp / "pg")], ["redis", str(machine_tmp / "redis"), port]):
            started = subprocess.run(script + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
            assert started.returncode == 0, started.stderr
            assert started.stdout.split()[-1] == "started"
        result = subprocess.run(["./dev", "run", "--smoke"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
        assert (machine_tmp / "pg" / "postmaster.pid").exists()
        assert _redis_answers(int(port))
        again = subprocess.run(script + ["redis", str(machine_tmp / "redis"), port], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
        assert again.stdout.split()[-1] == "reused"
    finally:
        subprocess.run(script + ["stop-redis", str(machine_tmp / "redis")], cwd=ROOT, env=env, timeout=60)
        subprocess.run(script + ["stop-postgres", str(machine_tmp / "pg")], cwd=ROOT, env=env, timeout=60)
    assert not _redis_answers(int(port))


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


def _admin_sign_in(api: str, username: str, password: str) -> str:
    """Submit the admin sign-in form as a browser would; the page it answers with."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{api}/admin/login/", timeout=10) as page:
        form = page.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token, form
    body = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1), "username": username,
                                   "password": password, "next": "/admin/"}).encode()
    with opener.open(f"{api}/admin/login/?next=/admin/", data=body, timeout=10) as answer:
        return str(answer.read().decode())


def _get(url: str) -> tuple[int, bytes, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read(), response.headers.get("Content-Type", "")


@pytest.mark.django_db
@pytest.mark.timeout(420)
def test_it_runs_on_embedded_services_and_goes_away_on_sigterm(machine_tmp: Path) -> None:
    # A fresh machine: no services and no secret key configured.
    env = _fresh_machine_env(machine_tmp)
    env["XMC_ADMIN_PASSWORD"] = "the-right-password"
    proc = subprocess.Popen(["./dev", "run"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out = _wait_for_line(proc, "stops everything", timeout=300)
        started = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        api = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("export XMC_API_URL="))

        # The admin is styled: its CSS is served outside debug.
        status, body, ctype = _get(f"{api}/static/admin/css/base.css")
        assert status == 200 and "text/css" in ctype and b"body" in body
        # The researcher's pages and their pinned htmx, served by the ASGI web process.
        ui = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("export XMANAGER_UI_URL="))
        status, body, ctype = _get(f"{ui}/login")
        assert status == 200 and b'name="password"' in body
        status, body, ctype = _get(f"{ui}/static/ui/vendor/htmx-2.0.11.min.js")
        assert status == 200 and "javascript" in ctype
        # A management command reaches the same database as the running system.
        manage = subprocess.run(
            ["./dev", "manage", "shell", "-c",
             "from django.contrib.auth.models import User; print(User.objects.filter(is_staff=True).count())"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert manage.returncode == 0, manage.stderr
        assert manage.stdout.strip().splitlines()[-1] == "1"
        # Five wrong passwords lock the account (README, "Signing in"), on the
        # embedded Redis of the run: even the right password is refused now.
        for _ in range(5):
            assert "Please enter the correct username" in _admin_sign_in(api, "admin", "wrong")
        assert "Too many failed sign-ins" in _admin_sign_in(api, "admin", "the-right-password")

        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    survivors = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert survivors == [], [psutil.Process(p).cmdline() for p in survivors]
    # The embedded Postgres and Redis it started are gone too; their data stays.
    # (And the test run's own services were never touched.)
    _suite_services_answer()
    assert not (machine_tmp / "pg" / "postmaster.pid").exists()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(env["XMC_EMBEDDED_REDIS_PORT"]))) != 0
    assert (machine_tmp / "secret_key").exists() and (machine_tmp / "env").exists()
