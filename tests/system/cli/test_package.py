"""The package itself: strict types, metadata, and its pure parts (targets, presentation, identity) without a server.

The pure modules import nothing but the standard library, so they are
imported here straight from ``clients/python/src``; everything else runs the
installed command (test_commands.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.system.cli.cli_env import PACKAGE, ensure_cli_venv

sys.path.insert(0, str(PACKAGE / "src"))
from xmc_cli import auth, present, targets  # noqa: E402
from xmc_cli.errors import CliError, Unauthenticated, UsageError  # noqa: E402


def test_it_type_checks_strictly_against_its_installed_dependencies() -> None:
    venv = ensure_cli_venv()
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable",
                           str(venv / "bin" / "python"), str(PACKAGE / "src" / "xmc_cli")],
                          cwd=PACKAGE.parent.parent, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_pins_small_standard_dependencies_and_python_310_in_its_metadata() -> None:
    venv = ensure_cli_venv()
    script = ("import importlib.metadata as m, json; d = m.metadata('xmc-client'); "
              "print(json.dumps({'requires': m.requires('xmc-client'), 'python': d['Requires-Python'], "
              "'scripts': [e.name for e in m.entry_points(group='console_scripts') if e.value.startswith('xmc_cli')]}))")
    meta = json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True,
                                     check=True).stdout)
    assert sorted(r for r in meta["requires"] if "extra ==" not in r) == ["httpx<1,>=0.27", "rich<15,>=13.7"]
    assert meta["python"] == ">=3.10" and meta["scripts"] == ["xmc"]


@pytest.mark.parametrize(("text", "xid", "wids"), [
    ("12", 12, ()), ("12/3", 12, (3,)), ("12/3,5", 12, (3, 5)), ("12/3-5", 12, (3, 4, 5)), ("12/5,3-4,5", 12, (5, 3, 4)),
    ("experiments/12/workUnits/3", 12, (3,)), ("http://x:8000/experiments/12?state=RUNNING", 12, ()),
    ("https://x/experiments/7/workUnits/2#logs", 7, (2,)),
])
def test_it_parses_targets(text: str, xid: int, wids: tuple[int, ...]) -> None:
    assert targets.parse(text) == targets.Target(xid, wids)


@pytest.mark.parametrize("text", ["", "x", "12/", "12/x", "12/3,", "12/5-3", "0", "12/0", "-1", "12/1-99999", "12/3/4"])
def test_it_refuses_bad_targets(text: str) -> None:
    with pytest.raises(UsageError):
        targets.parse(text)


def test_it_says_when_a_work_unit_is_needed() -> None:
    with pytest.raises(UsageError, match="names no work unit"):
        targets.parse("12", need_wid=True)
    with pytest.raises(UsageError, match="several"):
        targets.parse("12/1,2", one_wid=True)


def _unit(state: str, **status: object) -> dict[str, object]:
    return {"name": "experiments/1/workUnits/2",
            "executable": {"schedulingConstraints": {"queueName": "demo-queue"}},
            "currentWorkUnitExecution": {"name": "experiments/1/workUnits/2/executions/3",
                                         "status": {"state": state, **status}}}


def test_it_puts_the_servers_sentence_after_the_state_and_the_details_after_it_in_why() -> None:
    queued = present.why({**_unit("SCHEDULING", schedulingInformation={
        "userFacingText": "Waiting for quota", "auxiliaryInfo": {"queueInfo": {"positionInQueue": 2, "totalWorkloadsInQueue": 5}}}),
        "sentence": "Waiting for quota in demo-queue: position 2 of 5"})
    assert queued[0].startswith("Scheduling") and "(execution 3)" in queued[0]
    assert queued[1:] == ["Waiting for quota in demo-queue: position 2 of 5", "Scheduler: Waiting for quota"]
    failed = present.why(_unit("FAILED", detailedStatus={"jobsetStatus": {
        "conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "jobset failed"}],
        "replicatedJobsStatus": [{"name": "main", "failed": "1"}]}},
        systemMessage={"userFacingText": "OOMKilled", "userFacingUrl": {"url": "https://console/x"}}))
    assert failed[1:] == ["JobSet: jobset failed (FailedJobs).", "Jobs: main 1 failed.", "System: OOMKilled  <https://console/x>"]
    newest = [{"content": {"userFacingText": "checkpoint written", "severity": "INFO"}}]
    assert present.why(_unit("RUNNING"), newest)[1:] == ["Last message (info): checkpoint written"]
    unsafe = present.why(_unit("FAILED", userMessage={"userFacingText": "x", "userFacingUrl": {"url": "javascript:alert(1)"}}))
    assert unsafe[-1] == "Job: x"


def test_it_words_no_reason_of_its_own() -> None:
    """Without the server's sentence (an older server without the headlines read) why says the state and the
    details it read, never a reason worded here: the server owns that (workunits.headline)."""
    for state in ("SCHEDULING", "SCHEDULING_PAUSED", "DESCHEDULING", "INITIALIZING", "STARTING", "FAILED", "STOPPED"):
        assert present.why(_unit(state))[1:] == [], state


def test_it_presents_sweeps_rollups_and_times() -> None:
    args = [{"lr": "0.1", "steps": "1"}, {"lr": "0.2", "steps": "1"}, {"steps": "1", "seed": "3"}]
    assert present.differing(args) == ["lr", "seed"]
    assert present.rollup_text({"FAILED": 1, "RUNNING": 2, "COMPLETED": 3}) == "2▶ 3✓ 1✗"
    assert present.rollup_text({}) == "—"
    assert present.when("2026-12-01T21:40:03.123456789Z") is not None  # nanoseconds, Python 3.10 too
    assert present.duration("2026-12-01T21:40:03Z", "2026-12-01T22:45:10Z") == "1h05m"


def _write(path: Path, deployments: dict[str, object], mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "deployments": deployments}))
    os.chmod(path, mode)


def test_it_follows_the_launch_client_for_identity(tmp_path: Path) -> None:
    creds = tmp_path / "xdg" / "xmc" / "credentials.json"
    env = {"XMC_API_URL": "HTTP://LocalHost:8000/some/path", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert auth.resolve_origin(env) == "http://localhost:8000"
    assert auth.resolve_origin({"XMANAGER_ENDPOINT": "dns:///grpc.xmc.example.com:443"}) == "https://xmc.example.com"
    assert auth.resolve_origin({"XMANAGER_UI_URL": "xmc.example.com"}) == "https://xmc.example.com"
    with pytest.raises(CliError, match="set XMC_API_URL"):
        auth.resolve_origin({})
    with pytest.raises(Unauthenticated, match="not logged in to http://localhost:8000"):
        auth.identity(env)
    _write(creds, {"http://localhost:8000": {"access_token": "t", "email": "a@x.com", "expires_at": time.time() + 3600}})
    ident = auth.identity(env)
    assert (ident.token, ident.email, ident.source) == ("t", "a@x.com", str(creds))
    assert auth.identity({**env, "XMC_AUTH_TOKEN": "env-token"}).token == "env-token"
    _write(creds, {"http://localhost:8000": {"access_token": "t", "email": "a@x.com", "expires_at": time.time() + 59}})
    with pytest.raises(Unauthenticated, match="expired"):
        auth.identity(env)
    _write(creds, {"http://localhost:8000": {"access_token": "t", "email": "a@x.com", "expires_at": True}})
    with pytest.raises(Unauthenticated, match="incomplete"):
        auth.identity(env)
    _write(creds, {}, mode=0o640)
    with pytest.raises(CliError, match="0600"):
        auth.identity(env)
    custom = tmp_path / "elsewhere.json"
    _write(custom, {"http://localhost:8000": {"access_token": "c", "email": "a@x.com", "expires_at": time.time() + 3600}})
    assert auth.identity({**env, "XMC_CREDENTIALS_FILE": str(custom)}).token == "c"


def test_it_reads_the_email_of_an_unverified_token() -> None:
    import base64

    payload = base64.urlsafe_b64encode(json.dumps({"email": "a@x.com"}).encode()).decode().rstrip("=")
    assert auth.email_of_token(f"h.{payload}.s") == "a@x.com"
    assert auth.email_of_token("garbage") == ""


def test_it_says_the_servers_sentence_as_is_in_why_and_status() -> None:
    """The server owns the why (GET /v1/experiments/{xid}/headlines, workunits.headline): printed unchanged."""
    unit = {**_unit("FAILED", systemMessage={"userFacingText": "Out of memory (OOMKilled): replica train-0 (pod p-1)"}),
            "headline": "out of memory (OOMKilled) in train-0", "sentence": "Out of memory (OOMKilled) in train-0",
            "reason": {"code": "FAILED", "cause": "OUT_OF_MEMORY", "replica": "train-0"}}
    assert present.why(unit)[1] == "Out of memory (OOMKilled) in train-0"
    assert present.headline_of(unit) == "Out of memory (OOMKilled) in train-0"
    older = {key: value for key, value in unit.items() if key not in ("sentence", "reason")}  # a server before sentence
    assert present.headline_of(older) == "out of memory (OOMKilled) in train-0"
    assert present.headline_of(_unit("RUNNING", userMessage={"userFacingText": "epoch 3"})) == "epoch 3"
