"""The MachineLearningRun client against the emulator: LROs, etags, error statuses, credentials;
the emulator command and the worker's start-up configuration check."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from lifecycle import mlrun_client
from lifecycle.mlrun_client import GoogleDefaultCredentials, MLRunClient, MLRunError, StaticToken
from simulators.mlrun import EmulatorHandle, run_emulator
from tests.celery_workers import CeleryWorkers

ROOT = Path(__file__).resolve().parents[2]
RUN = {"displayName": "r", "orchestrator": "GKE", "runPhase": "ACTIVE", "tools": [{"xprof": {}}]}


def client_for(emulator: EmulatorHandle, token: str = "t") -> MLRunClient:
    return MLRunClient("p", "us-central1", endpoint=emulator.url, credentials=StaticToken(token))


def test_it_creates_gets_updates_and_deletes_through_polled_operations() -> None:
    handle = run_emulator(port=0, op_polls=3)
    try:
        client = client_for(handle)
        created = client.create("run-1", RUN)
        assert created["name"] == "projects/p/locations/us-central1/machineLearningRuns/run-1"
        assert created["state"] == "STATE_ACTIVE" and re.fullmatch(r"[0-9a-f-]{36}", created["etag"])
        polls = [p for m, p in handle.emulator.requests if "/operations/" in p]
        assert len(polls) == 4  # three answers "not done", the fourth is done
        got = client.get("run-1")
        got["runPhase"] = "COMPLETED"
        updated = client.update(got)
        assert updated["runPhase"] == "COMPLETED" and updated["etag"] != got["etag"]
        assert updated["createTime"] == created["createTime"]
        client.delete("run-1")
        with pytest.raises(MLRunError) as caught:
            client.get("run-1")
        assert caught.value.not_found and caught.value.http_status == 404
    finally:
        handle.stop()


def test_it_tells_409s_apart_by_error_status(emulator: EmulatorHandle) -> None:
    client = client_for(emulator)
    run = client.create("run-1", RUN)
    with pytest.raises(MLRunError) as exists:
        client.create("run-1", RUN)
    assert exists.value.http_status == 409 and exists.value.already_exists and not exists.value.etag_conflict
    client.update({**run, "displayName": "other"})
    with pytest.raises(MLRunError) as stale:
        client.update(run)  # the etag it carries is old now
    assert stale.value.http_status == 409 and stale.value.etag_conflict and stale.value.status == "ABORTED"


def test_it_enforces_the_documented_request_rules_in_the_emulator(emulator: EmulatorHandle) -> None:
    client = client_for(emulator)
    run = client.create("run-1", RUN)
    base = f"{emulator.url}/v1alpha/{run['name']}"
    headers = {"Authorization": "Bearer t"}
    partial = requests.patch(base, params={"updateMask": "runPhase"}, json=run, headers=headers, timeout=10)
    assert partial.status_code == 400 and partial.json()["error"]["status"] == "INVALID_ARGUMENT"
    no_etag = requests.patch(base, params={"updateMask": "*"}, json={**run, "etag": ""}, headers=headers, timeout=10)
    assert no_etag.status_code == 400
    anonymous = requests.get(base, timeout=10)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["status"] == "UNAUTHENTICATED"
    with pytest.raises(MLRunError) as bad:
        client.create("Bad_Id", RUN)
    assert bad.value.status == "INVALID_ARGUMENT"
    with pytest.raises(MLRunError) as no_tools:
        client.create("run-2", {**RUN, "tools": []})
    assert no_tools.value.status == "INVALID_ARGUMENT"


def test_it_reports_transport_failures_as_unavailable() -> None:
    handle = run_emulator(port=0)
    url = handle.url
    handle.stop()
    client = MLRunClient("p", "l", endpoint=url, credentials=StaticToken("t"), timeout_s=2)
    with pytest.raises(MLRunError) as caught:
        client.get("x")
    assert caught.value.status == "UNAVAILABLE"


def test_it_uses_google_default_credentials_in_production_imported_lazily(settings: Any) -> None:
    settings.XMC_MLRUN_TOKEN = ""
    assert isinstance(mlrun_client.default_token_provider(), GoogleDefaultCredentials)
    assert "google.auth" not in mlrun_client.__dict__
    settings.XMC_MLRUN_TOKEN = "static"
    provider = mlrun_client.default_token_provider()
    assert isinstance(provider, StaticToken) and provider.token() == "static"
    settings.XMC_MLRUN_ENDPOINT = ""
    assert MLRunClient.from_settings().base == "https://hypercomputecluster.googleapis.com/v1alpha"


def test_it_serves_the_emulator_command_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "simulators.mlrun", "--port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"serving (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        assert requests.get(f"{match.group(1)}/emulator/runs", timeout=10).json() == {"runs": []}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_it_keeps_the_emulators_runs_across_a_restart_of_the_command(tmp_path: Path) -> None:
    """``./dev run`` restarted: the MachineLearningRuns it made are still there (``--state-file``)."""
    state = tmp_path / "mlrun.json"

    def serve() -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen([sys.executable, "-m", "simulators.mlrun", "--port", "0", "--state-file", str(state)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        match = re.search(r"serving (http://127\.0\.0\.1:\d+)", proc.stdout.readline())
        assert match
        return proc, match.group(1)

    proc, url = serve()
    try:
        client = MLRunClient("p", "us-central1", endpoint=url, credentials=StaticToken("t"))
        created = client.create("run-kept", RUN)
        client.create("run-gone", RUN)
        client.delete("run-gone")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    proc, url = serve()
    try:
        client = MLRunClient("p", "us-central1", endpoint=url, credentials=StaticToken("t"))
        again = client.get("run-kept")
        assert (again["etag"], again["createTime"], again["state"]) == (
            created["etag"], created["createTime"], "STATE_ACTIVE")
        with pytest.raises(MLRunError) as caught:
            client.get("run-gone")
        assert caught.value.not_found
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_it_refuses_to_start_a_worker_with_the_flag_on_and_no_project(celery_workers: CeleryWorkers) -> None:
    started = time.monotonic()
    worker = celery_workers.start("lifecycle", env={"XMC_ARTIFACT_LIFECYCLE_ENABLED": "true", "XMC_MLRUN_PROJECT": "",
                                                     "XMC_MLRUN_LOCATION": ""})
    assert worker.wait(timeout=120) != 0
    assert "XMC_MLRUN_PROJECT and XMC_MLRUN_LOCATION are not set" in celery_workers.log(worker)
    assert time.monotonic() - started < 120
