"""Embedded services belong to their run folder: two checkouts on one machine never share them.

``scripts/devservices.py`` reuses a Redis only when the server itself says
its directory is the run folder's; otherwise it starts one on a free port and
records it there. ``./dev manage`` talks to the system of its run folder, and
to nothing where no system has run. ``scripts/run_all.py`` gives each process
the port it had last time in the run folder when that port is free.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.ports import free_port
from tests.system.conftest import load_run_all
from tests.system.test_run_command import _admin_sign_in, _fresh_machine_env, _wait_for_line
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, "scripts/devservices.py"]


def _devservices(*args: str) -> str:
    done = subprocess.run(SCRIPT + list(args), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def two_run_folders(machine_tmp: Path) -> Iterator[tuple[Path, Path]]:
    first, second = machine_tmp / "checkout-a" / ".run", machine_tmp / "checkout-b" / ".run"
    yield first, second
    for run in (first, second):
        _devservices("stop-redis", str(run / "redis"))


@pytest.mark.timeout(120)
def test_it_gives_each_run_folder_its_own_redis_even_on_the_same_asked_for_port(
    two_run_folders: tuple[Path, Path],
) -> None:
    first, second = two_run_folders
    port = free_port()
    url_a, how_a = _devservices("redis", str(first / "redis"), str(port)).split()
    # The second checkout asks for the same port, where the first one's Redis answers.
    url_b, how_b = _devservices("redis", str(second / "redis"), str(port)).split()
    assert (how_a, how_b) == ("started", "started")
    assert url_a == f"redis://127.0.0.1:{port}/0" and url_b != url_a
    a, b = redis.Redis.from_url(url_a), redis.Redis.from_url(url_b)
    assert a.config_get("dir")["dir"] == str((first / "redis").resolve())
    assert b.config_get("dir")["dir"] == str((second / "redis").resolve())
    a.set("lockout:alice", "5")
    assert b.get("lockout:alice") is None
    # Each is found again by its own folder, through the port recorded there.
    assert (second / "redis" / "port").read_text().strip() == url_b.rsplit(":", 1)[1].split("/")[0]
    assert _devservices("redis", str(first / "redis"), str(port)).split() == [url_a, "reused"]
    assert _devservices("redis", str(second / "redis"), str(port)).split() == [url_b, "reused"]
    # Stopping one folder's Redis leaves the other's up.
    _devservices("stop-redis", str(second / "redis"))
    assert a.ping()
    with pytest.raises(redis.ConnectionError):
        b.ping()


@pytest.mark.timeout(120)
def test_it_refuses_manage_with_one_line_where_no_system_has_run(machine_tmp: Path) -> None:
    env = _fresh_machine_env(machine_tmp / "never-run")
    done = subprocess.run(["./dev", "manage", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=110, check=False)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dev manage: no system has run in {machine_tmp / 'never-run'}")
    assert "./dev run" in last
    # Nothing was started there: no Postgres, no Redis.
    assert not (machine_tmp / "never-run" / "pg").exists()
    assert not (machine_tmp / "never-run" / "redis").exists()


def test_it_never_signals_the_process_a_stale_postmaster_pid_names(tmp_path: Path) -> None:
    """A postmaster that was killed leaves its ``postmaster.pid``; its pid is soon another process's (two
    suites on a machine go through Linux's 32,768 pids in minutes). Stopping the folder's Postgres sent that
    process SIGINT, which a pytest beside it takes as Ctrl-C."""
    # Waits for its stdin to close, and SIGINT ends it.
    bystander = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        pg = tmp_path / "pg"
        pg.mkdir()
        an_hour_ago = int(time.time()) - 3600
        (pg / "postmaster.pid").write_text(f"{bystander.pid}\n{pg}\n{an_hour_ago}\n5432\n{pg}\n127.0.0.1\n"
                                           "  5432001         0\nready   \n")
        _devservices("stop-postgres", str(pg))  # a SIGINT it sent would be waited out: it waits for the exit
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.timeout(240)
def test_it_has_manage_talk_to_the_run_folders_services_whatever_the_shell_points_at(machine_tmp: Path) -> None:
    run = machine_tmp / "ran-once"
    run.mkdir()
    # What ./dev run leaves behind when it ran on the embedded services: no DATABASE_URL / REDIS_URL in env.
    (run / "env").write_text("export XMC_SECRET_KEY=kept-by-the-run\n")
    env = _fresh_machine_env(run)
    env.update(DATABASE_URL="postgres://postgres@127.0.0.1:1/elsewhere", REDIS_URL="redis://127.0.0.1:1/0")
    try:
        done = subprocess.run(["./dev", "manage", "shell", "-c",
                               "from django.conf import settings; print(settings.REDIS_URL, settings.SECRET_KEY)"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=200, check=False)
        assert done.returncode == 0, done.stderr
        port = (run / "redis" / "port").read_text().strip()
        assert done.stdout.strip().splitlines()[-1] == f"redis://127.0.0.1:{port}/0 kept-by-the-run"
    finally:
        _devservices("stop-redis", str(run / "redis"))
        _devservices("stop-postgres", str(run / "pg"))


def test_it_gives_a_restart_the_ports_of_the_last_run_when_they_are_free(
    machine_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine_tmp.mkdir(exist_ok=True)
    monkeypatch.delenv("XMC_WEB_PORT", raising=False)
    run_all = load_run_all(machine_tmp, monkeypatch)
    with socket.socket() as taken:  # the default is someone else's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        default = taken.getsockname()[1]
        first = run_all.stable_port("web", "XMC_WEB_PORT", default)
    assert first != default
    # The restart: the default is free again, but the URLs printed last time name `first`.
    assert run_all.stable_port("web", "XMC_WEB_PORT", default) == first
    assert load_run_all(machine_tmp, monkeypatch).stable_port("web", "XMC_WEB_PORT", default) == first
    # Only when it is taken does the port move (and the new one is kept from then on).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        moved = run_all.stable_port("web", "XMC_WEB_PORT", default)
    assert moved != first
    assert run_all.stable_port("web", "XMC_WEB_PORT", default) == moved
    # An explicit setting wins over what was recorded.
    explicit = free_port()
    monkeypatch.setenv("XMC_WEB_PORT", str(explicit))
    assert run_all.stable_port("web", "XMC_WEB_PORT", default) == explicit


_CHOOSE = ("import sys; sys.path.insert(0, 'scripts'); import run_all; "
           "print(run_all.free_port(int(sys.argv[1])), flush=True); sys.stdin.read()")


@pytest.mark.timeout(120)
def test_it_never_gives_two_runs_started_together_the_same_port(machine_tmp: Path) -> None:
    """A run chooses its ports seconds before its processes bind them (each waits for the one before):
    two checkouts started together both found Prometheus's 9090 free, and the second's Prometheus died."""
    machine_tmp.mkdir(exist_ok=True)
    env = {**os.environ, "XMC_PORT_CLAIMS": str(machine_tmp / "claims.json"), "XMC_RUN_DIR": str(machine_tmp / "run")}
    preferred = free_port()  # nothing listens on it, the whole time

    def run() -> tuple[subprocess.Popen[str], int]:
        proc = subprocess.Popen([sys.executable, "-c", _CHOOSE, str(preferred)], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        return proc, int(proc.stdout.readline())

    first, port = run()
    try:
        assert port == preferred
        second, other = run()
        second.communicate("", timeout=30)
        assert other != preferred  # the first run lives and has not bound its port yet
    finally:
        first.communicate("", timeout=30)
    third, again = run()  # the first run is gone, and its claim with it
    third.communicate("", timeout=30)
    assert again == preferred

@pytest.mark.django_db
@pytest.mark.timeout(600)
def test_it_runs_two_systems_side_by_side_each_with_its_own_broker_and_sign_in_throttle(machine_tmp: Path) -> None:
    # Two checkouts: two run folders, the same first-choice Redis port (6390 for both, as on a real machine).
    envs = [_fresh_machine_env(machine_tmp / name) for name in ("a", "b")]
    envs[1]["XMC_EMBEDDED_REDIS_PORT"] = envs[0]["XMC_EMBEDDED_REDIS_PORT"]
    for env in envs:
        env["XMC_ADMIN_PASSWORD"] = "the-right-password"
    procs = [subprocess.Popen(["./dev", "run"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for env in envs]
    try:
        outs = [_wait_for_line(proc, "stops everything", timeout=420) for proc in procs]
        apis = [next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("export XMC_API_URL="))
                for out in outs]
        brokers = [(machine_tmp / name / "redis" / "port").read_text().strip() for name in ("a", "b")]
        assert brokers[0] != brokers[1]
        # Five wrong passwords lock the admin of system a; system b's admin signs in.
        for _ in range(5):
            assert "Please enter the correct username" in _admin_sign_in(apis[0], "admin", "wrong")
        assert "Too many failed sign-ins" in _admin_sign_in(apis[0], "admin", "the-right-password")
        assert "Too many failed sign-ins" not in _admin_sign_in(apis[1], "admin", "the-right-password")
        # Each broker is its run folder's own Redis, and each system's processes are connected to it.
        for name, port in zip(("a", "b"), brokers):
            own = redis.Redis(host="127.0.0.1", port=int(port))
            assert own.config_get("dir")["dir"] == str((machine_tmp / name / "redis").resolve())
            # Its processes connect as they start (the worker and beat after the web answers): wait for one.
            eventually(lambda: len(own.client_list()) > 1, 60, f"a process of system {name} on its broker")
        # ./dev manage in each folder reaches that folder's system.
        for env, name in zip(envs, ("a", "b")):
            done = subprocess.run(["./dev", "manage", "shell", "-c",
                                   "from django.conf import settings; print(settings.REDIS_URL)"],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip().splitlines()[-1] == f"redis://127.0.0.1:{brokers[0 if name == 'a' else 1]}/0"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


@pytest.mark.timeout(600)
def test_it_runs_dev_test_in_two_checkouts_at_once_each_on_its_own_services(machine_tmp: Path) -> None:
    # Two checkouts' ./dev test: two test run folders, the same first-choice Redis port (6391 on a real machine).
    envs = []
    port = str(free_port())
    for name in ("a", "b"):
        env = _fresh_machine_env(machine_tmp / name)
        env["XMC_TEST_RUN_DIR"] = str(machine_tmp / name / "test")
        env["XMC_TEST_REDIS_PORT"] = port
        envs.append(env)
    argv = ["./dev", "test", "tests/api/auth/test_login_throttle.py", "-q", "-p", "no:cacheprovider"]
    try:
        procs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for env in envs]
        outs = [proc.communicate(timeout=540)[0] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], outs
        ports = [(machine_tmp / name / "test" / "redis" / "port").read_text().strip() for name in ("a", "b")]
        assert ports[0] != ports[1] and port in ports
    finally:
        for name in ("a", "b"):
            _devservices("stop-redis", str(machine_tmp / name / "test" / "redis"))
            _devservices("stop-postgres", str(machine_tmp / name / "test" / "pg"))
