"""The installed `xmc` command against the whole system (run_all, the simulator behind it).

Alice launches over REST (as a launch script would); every command runs as a
subprocess of the installed console script, at 80 columns, and is checked
for what a researcher reads: the table rows, the JSON, the one error line and
the exit code. One live system for the module.
"""
from __future__ import annotations

import html
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from tests import waiting
from tests.system import signin
from tests.system.cli import rest
from tests.system.cli.conftest import system_env
from tests.system.cli.cli_env import ROOT
from tests.system.cli.runner import ALICE, BOB, Run, Xmc
from tests.system.e2e.conftest import System

# No django_db mark: the tests share one system and its data for the module, and read it only
# through the command (a transactional test would truncate the tables after each test).

QUICK_OK = "pull=1s;run=2s;exit=0"
QUICK_FAIL = "pull=1s;run=2s;exit=3"
FOREVER = "pull=1s;run=100000s;exit=0"


def eventually(check: Any, what: str, timeout: float = 90.0) -> Any:
    return waiting.eventually(check, timeout, what, interval=1.0)


@pytest.fixture(scope="module")
def sweep(system: System, tokens: dict[str, str]) -> int:
    """Alice's sweep: lr differs, steps is shared; unit 1 completes, 2 fails (exit 3, one retry), 3 runs on."""
    return rest.experiment(system.api, tokens[ALICE], "lr sweep", [
        rest.work_unit(QUICK_OK, args={"lr": "0.1", "steps": "100"}),
        rest.work_unit(QUICK_FAIL, args={"lr": "0.01", "steps": "100"}, retries=1),
        rest.work_unit(FOREVER, args={"lr": "0.001", "steps": "100"}),
    ])


def _states(xmc: Xmc, xid: int, token: str) -> dict[int, str]:
    body = xmc("status", str(xid), "--json", token=token).ok().json
    return {u["wid"]: u["state"] for u in body["workUnits"]}


def wait_states(xmc: Xmc, xid: int, token: str, want: Any, what: str, timeout: float = 150.0) -> dict[int, str]:
    """Poll ``xmc status --json`` until ``want(states)`` holds (or equals ``want``); the failure shows the last states."""
    seen: list[dict[int, str]] = []

    def check() -> Any:
        seen.append(_states(xmc, xid, token))
        return want(seen[-1]) if callable(want) else seen[-1] == want

    waiting.eventually(check, timeout, what, interval=1.0, detail=lambda: f"last states: {seen[-1] if seen else None}")
    return seen[-1]


def _one_error_line(run: Run, code: int, *words: str) -> str:
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("xmc: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def test_it_lists_the_experiment_as_a_table_and_as_json(xmc: Xmc, sweep: int, tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    table = xmc("list", token=alice).ok()
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["XID", "TITLE", "OWNER", "UNITS", "W/E", "CREATED", "TIME"]
    assert all(len(line) <= 80 for line in table.stdout.splitlines()), table.stdout
    [row] = [r for r in rows if r.split()[0] == str(sweep)]
    assert "lr sweep" in row and "alice@example.com" in row

    listed = xmc("list", "--json", "--mine", token=alice).ok().json["experiments"]
    [mine] = [e for e in listed if e["xid"] == sweep]
    assert mine["owner"] == ALICE and mine["title"] == "lr sweep"
    assert mine["experiment"]["name"] == f"experiments/{sweep}"
    assert sum(mine["stateCounts"].values()) == 3

    # Bob sees none of it, with or without --mine; a filter goes to the server as AIP-160.
    assert sweep not in [e["xid"] for e in xmc("list", "--json", token=tokens[BOB]).ok().json["experiments"]]
    assert xmc("list", "--json", "--filter", 'title = "no such title"', token=alice).ok().json == {"experiments": []}
    _one_error_line(xmc("list", "--filter", "title = = x", token=alice), 4, "refused", "INVALID_ARGUMENT")
    _one_error_line(xmc("list", "--state", "sideways", token=alice), 2, "unknown state")

    # --state with a work unit state keeps the experiments with a unit in it.
    eventually(lambda: sweep in [e["xid"] for e in xmc("list", "--state", "running", "--json", token=alice)
                                 .ok().json["experiments"]], "the sweep listed under --state running")
    active = xmc("list", "--state", "active", "--json", token=alice).ok().json["experiments"]
    assert sweep in [e["xid"] for e in active]


def test_it_shows_the_units_the_args_that_differ_and_their_progress_in_status(xmc: Xmc, sweep: int,
                                                                       tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    wait_states(xmc, sweep, alice, {1: "COMPLETED", 2: "FAILED", 3: "RUNNING"}, "unit 1 completed, 2 failed, 3 running")
    out = xmc("status", str(sweep), token=alice).ok().stdout
    lines = out.splitlines()
    assert lines[0] == f"Experiment {sweep}  lr sweep"
    assert "owner alice@example.com" in lines[1] and "launch completed" in lines[1]
    assert lines[2].split() == ["Units", "1▶", "1✓", "1✗"]
    assert lines[3] == "Shared args steps=100"
    header = next(line for line in lines if line.startswith("WID"))
    assert header.split() == ["WID", "JOB", "STATE", "EX", "lr", "MESSAGE", "TIME"]  # lr differs, steps is shared
    rows = {int(line.split()[0]): line for line in lines[lines.index(header) + 1:]}
    assert "✓ completed" in rows[1] and "0.1" in rows[1]
    assert "✗ failed" in rows[2] and "0.01" in rows[2]
    assert "▶ running" in rows[3] and "0.001" in rows[3]
    assert all(len(line) <= 80 for line in lines), out

    body = xmc("status", f"{sweep}/2", "--json", token=alice).ok().json
    [unit] = body["workUnits"]
    assert unit["wid"] == 2 and unit["state"] == "FAILED" and unit["args"] == {"lr": "0.01", "steps": "100"}
    assert unit["execution"] == 1 and unit["workUnit"]["name"] == f"experiments/{sweep}/workUnits/2"
    assert body["summary"]["xid"] == sweep and body["experiment"]["title"] == "lr sweep"
    _one_error_line(xmc("status", f"{sweep}/9", token=alice), 4, f"work unit {sweep}/9 not found")


def test_it_says_in_words_why_it_failed_or_what_it_does_in_why(xmc: Xmc, sweep: int, tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    wait_states(xmc, sweep, alice, lambda s: s.get(2) == "FAILED", "unit 2 failed")
    failed = xmc("why", f"{sweep}/2", token=alice).ok().stdout
    first, *rest_lines = failed.splitlines()
    assert first.startswith(f"{sweep}/2 ✗ failed") and "(execution 1)" in first
    # The server's sentence first (workunits.headline), the details after it.
    assert rest_lines[0].strip() == "Exited with code 3, twice (retry limit 1)", failed
    assert "(FailedJobs)" in failed and "Jobs: main 1 failed." in failed, failed
    assert "exited with code 3" in failed, failed  # the reconciler's explanation (system message), in words
    running = xmc("why", f"{sweep}/3", "--json", token=alice).ok().json
    assert running["state"] == "RUNNING" and running["reason"] == {"code": "RUNNING"} and running["sentence"] == ""
    assert running["reasons"][0].startswith("Running")
    assert running["workUnit"]["name"] == f"experiments/{sweep}/workUnits/3"
    _one_error_line(xmc("why", str(sweep), token=alice), 2, "names no work unit")


def test_it_explains_a_queued_unit_with_its_queue_and_position_in_why(xmc: Xmc, system: System,
                                                              tokens: dict[str, str]) -> None:
    """Two units asking 3 of the 4 CPUs of demo-queue: the second waits, and why says where."""
    alice = tokens[ALICE]
    xid = rest.experiment(system.api, alice, "queue", [
        rest.work_unit(FOREVER, queue="demo-queue", cpu_millicores=3000),
        rest.work_unit(FOREVER, queue="demo-queue", cpu_millicores=3000),
    ])
    try:
        wait_states(xmc, xid, alice, {1: "RUNNING", 2: "SCHEDULING"}, "1 running, 2 queued")
        out = eventually(lambda: (lambda o: "demo-queue" in o and o)(xmc("why", f"{xid}/2", token=alice).ok().stdout),
                         "the queue named")
        assert out.splitlines()[0].startswith(f"{xid}/2 … scheduling")
        assert "Waiting for quota in demo-queue" in out, out  # the server's headline (workunits.headline)
    finally:
        xmc("stop", str(xid), "--yes", token=alice)


def _signed_in_page(system: System, path: str) -> str:
    """``path`` as Alice sees it in her browser: a password for her account, then the site's own sign-in form."""
    script = ("from django.contrib.auth import get_user_model; U = get_user_model(); "
              f"u, _ = U.objects.get_or_create(username='alice', defaults={{'email': {ALICE!r}}}); "
              "u.email = " + repr(ALICE) + "; u.set_password('alice-password'); u.save()")
    subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=system_env(system),
                   capture_output=True, text=True, timeout=120, check=True)
    return signin.page(system.exports["XMANAGER_UI_URL"], "alice", "alice-password", path)


def test_it_says_the_same_sentence_on_the_page_and_in_the_command(xmc: Xmc, system: System, sweep: int,
                                                        tokens: dict[str, str]) -> None:
    """One owner of "why is it not running" (workunits.headline): the unit's page, its row in the sweep
    table, ``xmc why`` and ``xmc status`` show the server's one sentence, word for word."""
    alice = tokens[ALICE]
    wait_states(xmc, sweep, alice, lambda s: s.get(2) == "FAILED", "unit 2 failed")
    unit_page = _signed_in_page(system, f"/experiments/{sweep}/workUnits/2")
    found = re.search(r'data-reason="FAILED" id="why">([^<]+)<', unit_page)
    assert found, unit_page
    sentence = html.unescape(found.group(1))
    table = _signed_in_page(system, f"/experiments/{sweep}")
    row = re.search(r'<tr id="wu-2".*?<td class="why" data-reason="FAILED">([^<]*)<', table, re.S)
    assert row and html.unescape(row.group(1)) == sentence, table

    why = xmc("why", f"{sweep}/2", token=alice).ok().stdout.splitlines()
    assert why[1].strip() == sentence, why
    said = xmc("why", f"{sweep}/2", "--json", token=alice).ok().json
    assert said["sentence"] == sentence and said["reason"]["code"] == "FAILED" and said["reason"]["exitCode"] == 3
    [unit] = xmc("status", f"{sweep}/2", "--json", token=alice).ok().json["workUnits"]
    assert unit["sentence"] == sentence and unit["reason"] == said["reason"]
    wide = xmc("status", f"{sweep}/2", token=alice, COLUMNS="200").ok().stdout
    assert sentence in wide, wide


def test_it_tells_a_stranger_not_found(xmc: Xmc, sweep: int, tokens: dict[str, str]) -> None:
    bob = tokens[BOB]
    missing = _one_error_line(xmc("status", "999999", token=bob), 4, "not found")
    hidden = _one_error_line(xmc("status", str(sweep), token=bob), 4, "not found")
    assert hidden == missing.replace("999999", str(sweep))  # a stranger cannot tell the two apart
    _one_error_line(xmc("why", f"{sweep}/1", token=bob), 4, "not found")
    _one_error_line(xmc("open", str(sweep), token=bob), 4, "not found")
    _one_error_line(xmc("stop", f"{sweep}/3", token=bob), 4, "not found")
    _one_error_line(xmc("logs", f"{sweep}/1", token=bob), 4, "not found")
    assert _states(xmc, sweep, tokens[ALICE])[3] == "RUNNING"  # bob's stop did nothing


def test_it_says_errors_in_one_line_with_an_exit_code(xmc: Xmc, tmp_path: Any) -> None:
    no_login = xmc("list", token=None, XMC_CREDENTIALS_FILE=str(tmp_path / "none.json"))
    _one_error_line(no_login, 4, "not logged in", "run xmanager login")
    _one_error_line(xmc("list", token="not-a-token"), 4, "not authenticated", "run xmanager login")
    _one_error_line(xmc("list", token="x", XMC_API_URL=None, XMANAGER_UI_URL=None), 4, "set XMC_API_URL")
    _one_error_line(xmc("list", token="x", XMC_API_URL="http://127.0.0.1:9"), 4, "cannot reach XMC")
    _one_error_line(xmc("status", "12/x", token="x"), 2, "bad target")
    _one_error_line(xmc("status", token="x"), 2, "required")
    _one_error_line(xmc("logs", "1/1", "--tail", "-3", token="x"), 2, "--tail")


def test_it_prints_the_page_url_in_open(xmc: Xmc, system: System, sweep: int, tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    assert xmc("open", str(sweep), token=alice).ok().stdout.strip() == f"{system.api}/experiments/{sweep}"
    ui = "https://xmc.example.com"
    assert xmc("open", f"{sweep}/2", "--json", token=alice, XMANAGER_UI_URL=ui).ok().json == {
        "url": f"{ui}/experiments/{sweep}/workUnits/2"}
    _one_error_line(xmc("open", f"{sweep}/7", token=alice), 4, f"work unit {sweep}/7 not found")


def test_it_waits_for_the_operations_and_reports_each_unit_in_stop_and_restart(xmc: Xmc, system: System,
                                                                       tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    xid = rest.experiment(system.api, alice, "to stop", [rest.work_unit(FOREVER) for _ in range(3)])
    wait_states(xmc, xid, alice, lambda s: set(s.values()) == {"RUNNING"}, "three running units")

    # More than one unit needs --yes; nothing is sent without it.
    _one_error_line(xmc("stop", f"{xid}/1,2", token=alice), 2, "pass --yes")
    assert set(_states(xmc, xid, alice).values()) == {"RUNNING"}

    one = xmc("stop", f"{xid}/1", token=alice, timeout=120).ok()
    assert f"{xid}/1" in one.stdout and "✓ stopped" in one.stdout
    wait_states(xmc, xid, alice, lambda s: s[1] == "STOPPED", "unit 1 stopped")
    # Stopping it again is what the user wanted already: said plainly, not a red failure, exit 0.
    again = xmc("stop", f"{xid}/1", token=alice, timeout=120).ok()
    assert "already stopped" in again.stdout and "failed" not in again.stdout, again.stdout
    assert xmc("stop", f"{xid}/1", "--json", token=alice).ok().json["results"][0]["result"] == "already"

    restarted = xmc("restart", f"{xid}/1", "--json", token=alice, timeout=120).ok().json
    assert restarted["verb"] == "restart"
    [result] = restarted["results"]
    assert (result["xid"], result["wid"], result["result"], result["error"]) == (xid, 1, "done", None)
    eventually(lambda: xmc("status", f"{xid}/1", "--json", token=alice).ok().json["workUnits"][0]["execution"] == 2,
               "unit 1 on execution 2")

    everything = xmc("stop", str(xid), "--yes", "--json", token=alice, timeout=180).ok().json
    assert sorted(r["wid"] for r in everything["results"]) == [1, 2, 3]
    assert all(r["result"] == "done" for r in everything["results"]), everything
    wait_states(xmc, xid, alice, lambda s: set(s.values()) == {"STOPPED"}, "all stopped")
    _one_error_line(xmc("stop", str(xid), "--yes", token=alice), 4, "nothing to stop")

    # --no-wait returns with the operation requested.
    quick = xmc("restart", f"{xid}/2", "--no-wait", "--json", token=alice).ok().json["results"][0]
    assert quick["operation"].startswith(f"experiments/{xid}/workUnits/2/operations/")


def test_it_exits_1_in_watch_when_a_unit_fails_and_0_when_all_complete(xmc: Xmc, system: System,
                                                                 tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    mixed = rest.experiment(system.api, alice, "watch mixed", [rest.work_unit(QUICK_OK),
                                                               rest.work_unit(QUICK_FAIL, retries=1)])
    good = rest.experiment(system.api, alice, "watch good", [rest.work_unit(QUICK_OK), rest.work_unit(QUICK_OK)])
    started = time.monotonic()
    failing = xmc.popen("watch", str(mixed), "--json", "--interval", "1", token=alice)
    passing = xmc("watch", str(good), "--interval", "1", token=alice, timeout=240)
    out, err = failing.communicate(timeout=240)
    assert failing.returncode == 1, (out, err)
    events = [__import__("json").loads(line) for line in out.splitlines()]
    assert events[-1]["event"] == "finished" and events[-1]["exitCode"] == 1
    assert events[-1]["stateCounts"] == {"COMPLETED": 1, "FAILED": 1}
    assert events[-1]["events"] is True  # it followed the pages' event stream (ui.events), not only polling
    seen = {(e["wid"], e["state"]) for e in events if e["event"] == "state"}
    assert (2, "FAILED") in seen and (1, "COMPLETED") in seen
    assert any(state in ("INITIALIZING", "SCHEDULING", "STARTING", "RUNNING") for _, state in seen)

    assert passing.returncode == 0, (passing.stdout, passing.stderr)
    assert f"{good}/1 " in passing.stdout and "completed" in passing.stdout  # one line per change when piped
    assert f"Experiment {good} finished: all completed" in passing.stderr
    assert time.monotonic() - started < 240

    stopped = rest.experiment(system.api, alice, "watch stopped", [rest.work_unit(FOREVER)])
    wait_states(xmc, stopped, alice, lambda s: s[1] == "RUNNING", "running")
    xmc("stop", f"{stopped}/1", token=alice, timeout=120).ok()
    assert xmc("watch", str(stopped), token=alice, timeout=60).returncode == 3
    _one_error_line(xmc("watch", "999999", token=alice), 4, "not found")
    _one_error_line(xmc("watch", str(stopped), "--timeout", "1", token=alice, XMC_API_URL="http://127.0.0.1:9"), 4,
                    "cannot reach")


def test_it_is_announced_by_dev_run_with_how_to_install_it(system: System, xmc: Xmc) -> None:
    [hint] = [line for line in system.output if "researcher's command line" in line]
    assert "pip install " in hint and hint.split("pip install ")[1].split()[0].endswith("clients/python")
    assert "xmc status <xid>" in hint
    assert xmc("--version", token=None).ok().stdout.startswith("xmc ")
