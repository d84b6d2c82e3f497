"""``./dev run`` stopped and started again: the same addresses, and a finished unit's log still there.

A new user's day: start the system, launch, let the unit finish, stop with
Ctrl-C (here SIGTERM), start again. The restart takes the ports recorded in
the run folder (``scripts/run_all.py``, ``stable_port``), so every printed
export is the same; the simulator restores its pods, whose containers wait to
start in the new cluster life, and the finished unit's log comes from the
archive (``k8s_bridge.logs.service``) through the page, REST and ``xmc logs``.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psycopg
import pytest

from k8s_bridge.models import PodLogArchive
from tests import waiting
from tests.system import signin
from tests.system.cli import rest
from tests.system.cli.cli_env import ensure_cli_venv
from tests.system.cli.runner import Xmc
from tests.system.test_run_command import ROOT, _fresh_machine_env, _wait_for_line

EXPORTS = ("XMANAGER_ENDPOINT", "XMC_API_URL", "XMANAGER_UI_URL", "KUBECONFIG", "XMC_DASHBOARD_ENDPOINT")


def _start(env: dict[str, str]) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen(["./dev", "run"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = _wait_for_line(proc, "stops everything", timeout=300)
    exports = dict(m.groups() for m in re.finditer(r"^export (\w+)=(\S+)$", out, re.M))
    return proc, exports


def _run_database(env: dict[str, str]) -> str:
    """The URL of the running system's embedded Postgres (its run folder's, found running): the
    archive is read there directly, not through a ``./dev manage`` process per look."""
    found = subprocess.run([sys.executable, "scripts/devservices.py", "postgres", str(Path(env["XMC_RUN_DIR"]) / "pg")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    url, how = found.stdout.split()
    assert how == "reused", found.stdout  # the system's own, not one started here
    return url


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _panel(ui: str, path: str) -> str:
    """The logs panel as the admin sees it, signed in through the site's own form."""
    return signin.page(ui, "admin", "the-right-password", path)


def _the_first_job_after_the_restart_shows_every_state(api: str, token: str) -> None:
    """A 4 s, 2-replica job launched as the exports are printed, polled every 0.5 s as a person would:
    STARTING or RUNNING must show before COMPLETED (the old reconciler's lease, left held when the
    simulator stopped first, made the new one wait 15 s: the job ran and ended unseen)."""
    xid = rest.experiment(api, token, "first after the restart", [rest.work_unit("pull=1s;run=4s;exit=0", replicas=2)])
    seen: list[str] = []

    def ended() -> bool:
        unit = rest.call(api, token, "GET", f"/v1/experiments/{xid}/workUnits/1")
        state = str((unit.get("currentWorkUnitExecution") or {}).get("status", {}).get("state"))
        if not seen or seen[-1] != state:
            seen.append(state)
        return state in ("COMPLETED", "FAILED", "STOPPED")

    waiting.eventually(ended, 120, "the first job ended", interval=0.5)
    assert seen[-1] == "COMPLETED" and "RUNNING" in seen, seen


@pytest.mark.timeout(900)
def test_it_restarts_on_the_same_addresses_and_serves_a_finished_units_log_from_the_archive(machine_tmp: Path) -> None:
    env = _fresh_machine_env(machine_tmp / "run")
    for key in ("XMC_WEB_PORT", "XMC_SIM_PORT", "XMC_GRPC_PORT", "XMC_MLRUN_EMULATOR_PORT",
                "XMC_RECONCILER_METRICS_PORT"):
        env.pop(key)  # no explicit ports: what the run folder recorded is what a restart takes
    env["XMC_ADMIN_PASSWORD"] = "the-right-password"
    proc, first = _start(env)
    try:
        api, token = first["XMC_API_URL"], first["XMC_AUTH_TOKEN"]
        xid = rest.experiment(api, token, "finished before the restart",
                              [rest.work_unit("pull=1s;print=kept across restarts;run=2s;exit=0")])

        def state() -> str:
            unit = rest.call(api, token, "GET", f"/v1/experiments/{xid}/workUnits/1")
            return str((unit.get("currentWorkUnitExecution") or {}).get("status", {}).get("state"))

        waiting.eventually(lambda: state() == "COMPLETED", 180, "the unit completed", interval=1.0)
        logs = f"/v1/experiments/{xid}/workUnits/1/executions/1/logs"

        database = _run_database(env)

        def archived() -> bool:
            with psycopg.connect(database) as conn:
                found = conn.execute(f"SELECT count(*) FROM {PodLogArchive._meta.db_table} WHERE xid = %s "
                                     "AND status = %s", [xid, PodLogArchive.Status.ARCHIVED]).fetchone()
            return found is not None and found[0] == 1

        waiting.eventually(archived, 120, "the log archived", interval=0.5)
    finally:
        _stop(proc)

    proc, second = _start(env)
    try:
        assert {k: second.get(k) for k in EXPORTS} == {k: first.get(k) for k in EXPORTS}
        api, token, ui = second["XMC_API_URL"], second["XMC_AUTH_TOKEN"], second["XMANAGER_UI_URL"]
        _the_first_job_after_the_restart_shows_every_state(api, token)
        request = urllib.request.Request(f"{api}{logs}", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.headers["X-XMC-Log-Source"] == "archive", dict(answer.headers)
            assert "kept across restarts" in answer.read().decode()
        assert "kept across restarts" in _panel(ui, f"/experiments/{xid}/workUnits/1/logs")
        xmc = Xmc(ensure_cli_venv(), machine_tmp / "home", api)
        (machine_tmp / "home").mkdir()
        run = xmc("logs", f"{xid}/1", token=token).ok()
        assert "kept across restarts" in run.stdout and "Archived log" in run.stderr, (run.stdout, run.stderr)
    finally:
        _stop(proc)
