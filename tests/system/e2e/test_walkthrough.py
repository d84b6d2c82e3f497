"""The README walkthrough, end to end, on the system ``./dev run`` starts.

`system` (conftest) boots ``scripts/run_all.py`` -- simulator, MLRun
emulator, web, gRPC, Celery worker and beat, reconciler -- as separate
processes on the test database. The unmodified client
(``xmanager==0.8.5.post1``, the cached venv of tests/system/real_client) runs
``xmanager launch examples/walkthrough.py`` with the printed exports; the
test then watches what the processes write and checks each work unit's
states, history, messages, operations and artifacts, and finally restarts
and stops one through the REST API.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import requests
from django.db import close_old_connections, connection

from artifacts.models import Artifact
from experiments.models import Experiment
from tests.system.cli.cli_env import ensure_cli_venv
from tests.system.cli.runner import Xmc
from tests.system.e2e.conftest import ROOT, System, eventually
from tests.system.real_client.client_env import ensure_client_venv
from tests.system.real_client.conftest import Client
from workunits.models import Operation, StatusHistory, WorkUnitExecution

pytestmark = pytest.mark.django_db(transaction=True)

#: The artifact lifecycle on: the profiled work unit's xprof gets a MachineLearningRun link.
SYSTEM_ENV = {"XMC_ARTIFACT_LIFECYCLE_ENABLED": "true"}
RUN_SECONDS = 8
TERMINAL = {"COMPLETED", "FAILED", "STOPPED", "CANCELLED"}


def _client(system: System, tmp_path: Path) -> Client:
    workdir = tmp_path / "work"
    workdir.mkdir()
    grpc_target = system.exports["XMANAGER_ENDPOINT"].removeprefix("http://")
    return Client(ensure_client_venv(), workdir, grpc_target, system.api, system.exports["XMC_AUTH_TOKEN"])


def _rest(system: System, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{system.api}{path}", data=data, method=method, headers={
        "Authorization": f"Bearer {system.exports['XMC_AUTH_TOKEN']}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def _snapshot(xid: int) -> dict[int, tuple[int, str, str]]:
    """wid -> (eid, state, scheduling text) of every work unit's current execution."""
    close_old_connections()
    seen = {}
    for ex in WorkUnitExecution.objects.filter(work_unit__experiment_id=xid).select_related("work_unit"):
        if ex.eid == ex.work_unit.current_eid:
            text = (ex.scheduling_information or {}).get("userFacingText", "")
            seen[ex.work_unit.wid] = (ex.eid, ex.state, text)
    return seen


class Watcher:
    """Polls the current executions in the background and keeps every distinct observation."""

    def __init__(self) -> None:
        self.xid: int | None = None
        self.seen: dict[int, list[tuple[int, str, str]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.xid is None:
                close_old_connections()
                latest = Experiment.objects.filter(title="XMC walkthrough").order_by("-id").first()
                self.xid = latest.id if latest is not None else None
            if self.xid is not None:
                for wid, obs in _snapshot(self.xid).items():
                    history = self.seen.setdefault(wid, [])
                    if not history or history[-1] != obs:
                        history.append(obs)
            time.sleep(0.3)
        connection.close()  # this thread's own connection: the test database is dropped at the end

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _history(xid: int, wid: int, eid: int = 1) -> list[tuple[str, str]]:
    close_old_connections()
    rows = StatusHistory.objects.filter(execution__work_unit__experiment_id=xid, execution__work_unit__wid=wid,
                                        execution__eid=eid).order_by("id")
    return [(h.from_state, h.to_state) for h in rows]


def _execution(xid: int, wid: int, eid: int = 1) -> WorkUnitExecution:
    close_old_connections()
    return WorkUnitExecution.objects.get(work_unit__experiment_id=xid, work_unit__wid=wid, eid=eid)


def _signed_in(ui: str) -> requests.Session:
    """A browser-like session signed in on the pages' login (``/login``) as run_all's admin user."""
    session = requests.Session()
    session.get(f"{ui}/login", timeout=30).raise_for_status()
    answer = session.post(f"{ui}/login", timeout=30, allow_redirects=False, headers={"Referer": f"{ui}/login"},
                          data={"username": "admin", "password": os.environ.get("XMC_ADMIN_PASSWORD", "admin"),
                                "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    assert answer.status_code == 302, answer.text[:500]
    return session


@pytest.mark.timeout(480)
def test_it_runs_the_walkthrough_on_the_whole_system(system: System, tmp_path: Path) -> None:
    client = _client(system, tmp_path)
    script = ROOT / "examples" / "walkthrough.py"
    with Watcher() as watcher:
        launch = client.xmanager("launch", str(script), "--", "--preempt_after=10", f"--run_seconds={RUN_SECONDS}",
                                 timeout=180).ok()
        result = launch.result
        xid = result["xid"]
        wids = result["wids"]
        assert watcher.xid == xid or watcher.xid is None
        watcher.xid = xid
        # The URL the real client prints opens the experiment page for a signed-in person.
        printed = re.search(r"XManager UI: (\S+)", launch.stdout + launch.stderr)
        assert printed and printed.group(1) == f"{system.exports['XMANAGER_UI_URL']}/experiments/{xid}", \
            launch.stdout
        pages = _signed_in(system.exports["XMANAGER_UI_URL"])
        page = pages.get(printed.group(1), timeout=30)
        assert page.status_code == 200 and 'id="units"' in page.text
        assert all(f'id="wu-{wid}"' in page.text for wid in wids.values())
        assert pages.get(f"{printed.group(1)}/workUnits/999", timeout=30).status_code == 404
        # Step 3 of the README: `xmc watch <xid>` waits for the end and tells how (1: `fails` failed).
        xmc = Xmc(ensure_cli_venv(), tmp_path, system.api)
        watching = xmc.popen("watch", str(xid), "--json", token=system.exports["XMC_AUTH_TOKEN"])

        def all_done() -> bool:
            states = {wid: obs[1] for wid, obs in _snapshot(xid).items()}
            return len(states) == 4 and all(state in TERMINAL for state in states.values())

        eventually(all_done, timeout=240, what=f"every work unit to finish; last seen {watcher.seen}")
    final = _snapshot(xid)
    watched, watch_err = watching.communicate(timeout=60)
    assert watching.returncode == 1, (watched, watch_err)
    assert json.loads(watched.splitlines()[-1])["stateCounts"] == {"COMPLETED": 3, "FAILED": 1}
    assert {wid: obs[1] for wid, obs in final.items()} == {
        wids["succeeds"]: "COMPLETED", wids["fails"]: "FAILED",
        wids["preempted"]: "COMPLETED", wids["profiled"]: "COMPLETED",
    }, (final, watcher.seen)

    # succeeds: the whole path, in order (SCHEDULING first when the reconciler
    # sees the JobSet before Kueue admits it).
    states = [to for _, to in _history(xid, wids["succeeds"])]
    assert states in (["INITIALIZING", "STARTING", "RUNNING", "COMPLETED"],
                      ["INITIALIZING", "SCHEDULING", "STARTING", "RUNNING", "COMPLETED"]), states

    # fails: FAILED, and the status says why (the JobSet's Failed condition, and
    # the system message: the replica, the container's exit code, the Job's
    # backoff limit; k8s_bridge.reconciler.explain).
    failed = _execution(xid, wids["fails"])
    fails_states = [to for _, to in _history(xid, wids["fails"])]
    assert "RUNNING" in fails_states and fails_states[-1] == "FAILED", fails_states
    conditions = (failed.detailed_status or {}).get("jobsetStatus", {}).get("conditions", [])
    [failure] = [c for c in conditions if c.get("type") == "Failed"]
    assert failure["status"] == "True" and failure["message"], failure
    explained = (failed.system_message or {}).get("userFacingText", "")
    assert "replica fails-0" in explained and "exited with code 1" in explained, explained
    assert "BackoffLimitExceeded" in explained and "after 2 failed pod(s)" in explained, explained
    # ... and its output can be read over REST by its owner, no cluster credentials needed.
    logs = urllib.request.Request(
        f"{system.api}/v1/experiments/{xid}/workUnits/{wids['fails']}/executions/1/logs?tailLines=1",
        headers={"Authorization": f"Bearer {system.exports['XMC_AUTH_TOKEN']}"})
    with urllib.request.urlopen(logs, timeout=30) as response:
        assert response.read().decode() == "[sim] fails: exiting with code 1\n"
        assert response.headers["X-XMC-Log-Replica"] == "fails-0"
    # ... and on its page: the failure card says why, and the logs panel shows the archived log as text.
    unit_page = pages.get(f"{printed.group(1)}/workUnits/{wids['fails']}", timeout=30).text
    assert 'id="failure"' in unit_page and "exited with code 1" in unit_page
    panel = pages.get(f"{printed.group(1)}/workUnits/{wids['fails']}/logs", timeout=60).text
    assert "[sim] fails: exiting with code 1" in panel
    rest = _rest(system, "GET", f"/v1/experiments/{xid}/workUnits/{wids['fails']}")
    rest_status = rest["currentWorkUnitExecution"]["status"]
    assert rest_status["state"] == "FAILED"
    assert failure["message"] in json.dumps(rest_status["detailedStatus"])

    # preempted: ran, was evicted by the HIGH one (back to SCHEDULING, with the
    # reason), ran again and completed -- all in the one execution.
    preempted_history = _history(xid, wids["preempted"])
    assert ("RUNNING", "SCHEDULING") in preempted_history, preempted_history
    after = preempted_history[preempted_history.index(("RUNNING", "SCHEDULING")):]
    assert "RUNNING" in [to for _, to in after] and after[-1][1] == "COMPLETED", preempted_history
    observed = watcher.seen[wids["preempted"]]
    ran_at = next(i for i, obs in enumerate(observed) if obs[1] == "RUNNING")
    evictions = [obs[2] for obs in observed[ran_at:] if obs[1] == "SCHEDULING"]
    assert any("Evicted (Preempted) by a higher-priority workload with priority 1000" in text
               for text in evictions), observed
    assert {obs[0] for obs in observed} == {1}

    # profiled: completed, and its managed xprof has a MachineLearningRun link.
    profiled_states = [to for _, to in _history(xid, wids["profiled"])]
    assert "RUNNING" in profiled_states and profiled_states[-1] == "COMPLETED", profiled_states

    def xprof_url() -> str:
        close_old_connections()
        artifact = Artifact.objects.get(experiment_id=xid, work_unit__wid=wids["profiled"])
        return str(((artifact.payload or {}).get("managedXprof") or {}).get("xprof", {}).get("xprofUrl", ""))

    url = eventually(xprof_url, timeout=60, what="the xprof link of the profiled work unit")
    assert f"xmc-{xid}-{wids['profiled']}-1" in url, url
    with urllib.request.urlopen(f"{system.exports['XMC_API_URL'].rsplit(':', 1)[0]}:"
                                f"{_mlrun_port(system)}/emulator/runs", timeout=10) as response:
        runs = response.read().decode()
    assert f"xmc-{xid}-{wids['profiled']}-1" in runs

    # Every CREATE operation is done without error, one per work unit.
    close_old_connections()
    creates = Operation.objects.filter(experiment_id=xid, action_type="CREATE")
    assert sorted(op.work_unit.wid for op in creates) == sorted(wids.values())
    assert all(op.done and not op.error for op in creates)

    # Restart a completed one through the REST API: a second execution runs
    # (the preempted one: it runs longest, so the stop below finds it running).
    again = wids["preempted"]
    _rest(system, "POST", f"/v1/experiments/{xid}/workUnits/{again}:restart", {})
    eventually(lambda: _snapshot(xid)[again][:2] in {(2, "RUNNING"), (2, "STARTING")}, timeout=90,
               what="execution 2 of the restarted work unit to start")
    assert _execution(xid, again, 1).state == "COMPLETED"
    # ... and stop it: the JobSet is deleted, its finalizer lets the reconciler write STOPPED.
    _rest(system, "POST", f"/v1/experiments/{xid}/workUnits/{again}:stop", {})
    eventually(lambda: _snapshot(xid)[again][:2] == (2, "STOPPED"), timeout=90,
               what=f"execution 2 to be STOPPED; seen {_snapshot(xid)}")
    close_old_connections()
    ops = {op.action_type: op for op in Operation.objects.filter(experiment_id=xid, work_unit__wid=again)}
    assert set(ops) == {"CREATE", "RESTART", "STOP"}
    eventually(lambda: all(op.done for op in Operation.objects.filter(experiment_id=xid, work_unit__wid=again)),
               timeout=60, what="the restart and stop operations to be done")
    assert ops["RESTART"].target_eid == 1 and ops["RESTART"].eid == 2


def _mlrun_port(system: System) -> str:
    line = next(line for line in system.output if line.startswith("run: mlrun"))
    return line.split("http://127.0.0.1:", 1)[1].split()[0]
