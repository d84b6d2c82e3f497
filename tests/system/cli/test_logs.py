"""`xmc logs` against the whole system (the logs endpoint of docs/architecture/logs.md).

The simulator's pods print what their script says (``print=``, ``log=every:``,
``stderr=``); `xmc logs` reads them through ``GET .../executions/{eid}/logs``,
live while the pod runs and archived after it, and ``-f`` receives a line
written after it started.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from tests import waiting
from tests.system.cli import rest
from tests.system.cli.runner import ALICE, BOB, Xmc
from tests.system.e2e.conftest import System

# No django_db mark: one shared system, read only through the command (see test_commands.py).

CHATTY = "pull=1s;print=hello from main;log=every:1s:step {n} loss {x};run=600s;exit=0"


def _wait_running(xmc: Xmc, xid: int, token: str, wid: int = 1) -> None:
    def running() -> bool:
        units = xmc("status", str(xid), "--json", token=token).ok().json["workUnits"]
        return {u["wid"]: u["state"] for u in units}.get(wid) == "RUNNING"

    waiting.eventually(running, 120, f"{xid}/{wid} running", interval=1.0)


def test_it_prints_the_pod_output_and_follows_new_lines(xmc: Xmc, system: System, tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    xid = rest.experiment(system.api, alice, "chatty", [rest.work_unit(CHATTY)])
    _wait_running(xmc, xid, alice)
    first = waiting.eventually(lambda: (lambda r: "step 2 " in r.stdout and r)(xmc("logs", f"{xid}/1", token=alice).ok()),
                               60, "two progress lines", interval=1.0)
    lines = first.stdout.splitlines()
    assert "hello from main" in lines
    assert any(line.startswith("step 1 loss ") for line in lines), lines

    tail = xmc("logs", f"{xid}/1", "--tail", "1", "--json", token=alice).ok().lines
    assert len(tail) == 1 and tail[0]["replica"] == "main-0" and tail[0]["source"] == "cluster"
    assert tail[0]["text"].startswith("step ") and tail[0]["timestamp"].endswith("Z")
    assert xmc("logs", f"{xid}/1", "--since", "1d", "--timestamps", token=alice).ok().stdout.startswith("20")
    # An answer without a line is never silent.
    none = xmc("logs", f"{xid}/1", "--tail", "0", token=alice).ok()
    assert none.stdout == "" and f"No log lines for execution 1 of work unit {xid}/1 in this window" in none.stderr

    # -f: the command keeps reading and prints a line the pod writes after it started.
    follow = xmc.popen("logs", f"{xid}/1", "-f", "--tail", "0", token=alice)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(iter(follow.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    started = time.monotonic()
    try:
        waiting.eventually(lambda: any(line.startswith("step ") for line in got), 30, "a followed line", interval=0.2)
    finally:
        follow.terminate()
        follow.wait(10)
    assert time.monotonic() - started < 30
    newest_before = int(first.stdout.split("step ")[-1].split()[0])
    followed = [int(line.split()[1]) for line in got if line.startswith("step ")]
    assert followed and followed[0] > newest_before, (followed, newest_before)

    # Errors: a replica that does not exist names those that do; a stranger is told "not found".
    wrong = xmc("logs", f"{xid}/1", "--replica", "main-7", token=alice)
    assert wrong.returncode == 4 and "main-0" in wrong.stderr, wrong.stderr
    stranger = xmc("logs", f"{xid}/1", token=tokens[BOB])
    assert stranger.returncode == 4 and stranger.stderr.strip() == f"xmc: work unit {xid}/1 not found"
    xmc("stop", str(xid), "--yes", token=alice, timeout=120).ok()


def test_it_prefixes_the_logs_of_several_replicas_and_reads_a_stopped_units_log_from_the_archive(
        xmc: Xmc, system: System, tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    xid = rest.experiment(system.api, alice, "replicas", [
        rest.work_unit("pull=1s;print=replica says hi;run=600s;exit=0", replicas=2)])
    _wait_running(xmc, xid, alice)

    def both() -> Any:
        run = xmc("logs", f"{xid}/1", token=alice).ok()
        return run.stdout.count("replica says hi") == 2 and run

    out = waiting.eventually(both, 60, "both replicas' lines", interval=1.0).stdout.splitlines()
    prefixes = {line.split(" │ ")[0].strip() for line in out if " │ " in line}
    assert prefixes == {"main-0", "main-1"}, out
    one = xmc("logs", f"{xid}/1", "--replica", "main-1", token=alice).ok()
    assert " │ " not in one.stdout and "replica says hi" in one.stdout

    # Stopped: the pods are gone and the archive answers, said on stderr.
    xmc("stop", f"{xid}/1", token=alice, timeout=120).ok()
    waiting.eventually(lambda: xmc("status", str(xid), "--json", token=alice).ok().json["workUnits"][0]["state"]
                       == "STOPPED", 120, "stopped", interval=1.0)

    def archived() -> Any:
        run = xmc("logs", f"{xid}/1", "--replica", "main-0", token=alice).ok()
        return "Archived log" in run.stderr and run

    run = waiting.eventually(archived, 60, "the archived log", interval=1.0)
    assert "replica says hi" in run.stdout
    records = xmc("logs", f"{xid}/1", "--json", token=alice).ok().lines
    assert {r["source"] for r in records} == {"archive"} and {r["replica"] for r in records} == {"main-0", "main-1"}
    missing = xmc("logs", f"{xid}/1", "--execution", "2", token=alice)
    assert missing.returncode == 4 and "execution 2 of work unit" in missing.stderr and "not found" in missing.stderr


def test_it_waits_for_the_pod_on_follow_right_after_a_launch_and_prints_every_line_the_last_included(
        xmc: Xmc, system: System, tokens: dict[str, str]) -> None:
    alice, admin = tokens[ALICE], system.exports["XMC_AUTH_TOKEN"]
    script = "pull=1s;print=the first line;log=every:1s:step {n};run=4s;exit=0;stderr=the very last line"
    # Scheduling paused holds the unit's create: the command surely starts before the pod, however
    # slow the machine, and the test lets the pod start once the command says it waits for it.
    rest.call(system.api, admin, "POST", "/v1/scheduling:pause", {"reason": "a test holds the first pod"})
    try:
        xid = rest.experiment(system.api, alice, "first minute", [rest.work_unit(script)])
        follow = xmc.start("logs", f"{xid}/1", "-f", token=alice)
        follow.wait_for(f"Waiting for the first pod of execution 1 of {xid}/1")
    finally:
        rest.call(system.api, admin, "POST", "/v1/scheduling:resume", {})
    run = follow.finish(timeout=180).ok()
    lines = run.stdout.splitlines()
    assert lines[0].startswith("[sim] main: started") and lines[1] == "the first line", run.stdout
    assert lines[-2:] == ["the very last line", "[sim] main: exiting with code 0"], run.stdout
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) >= 3 and steps == [f"step {n}" for n in range(1, len(steps) + 1)], run.stdout  # none twice
    # It said what it waited for, on stderr (stdout is the log alone).
    assert f"Waiting for the first pod of execution 1 of {xid}/1" in run.stderr, run.stderr


def test_it_says_so_on_previous_without_a_restart_and_goes_on_to_the_next_execution_on_follow_restarts(
        xmc: Xmc, system: System, tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    # Each execution runs until the test moves on (a fixed run time could end the first before the
    # restart on a slow machine): restarted once, then stopped once its second execution has printed.
    xid = rest.experiment(system.api, alice, "restarts", [rest.work_unit("pull=1s;print=hello from a pod;run=forever")])
    follow = xmc.start("logs", f"{xid}/1", "--follow-restarts", token=alice)
    try:
        _wait_running(xmc, xid, alice)
        previous = xmc("logs", f"{xid}/1", "--previous", token=alice)
        assert previous.returncode == 4, (previous.stdout, previous.stderr)
        assert "no previous instance of the container of execution 1" in previous.stderr, previous.stderr
        follow.wait_for("hello from a pod", stream="stdout")
        xmc("restart", f"{xid}/1", token=alice, timeout=120).ok()
        follow.wait_for(f"{xid}/1 restarted: following execution 2.")
        waiting.eventually(lambda: "".join(follow.out).count("hello from a pod") == 2, 120,
                           "the second execution's line")
        xmc("stop", f"{xid}/1", token=alice, timeout=120).ok()
    finally:
        run = follow.finish(timeout=180)
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert run.stdout.count("hello from a pod") == 2, (run.stdout, run.stderr)


def test_it_prints_only_what_comes_after_to_the_last_line_on_follow_with_tail_0(
        xmc: Xmc, system: System, tokens: dict[str, str]) -> None:
    alice = tokens[ALICE]
    xid = rest.experiment(system.api, alice, "tail 0", [rest.work_unit("pull=1s;print=written before;run=6s;exit=0")])
    _wait_running(xmc, xid, alice)
    run = xmc("logs", f"{xid}/1", "-f", "--tail", "0", token=alice, timeout=120).ok()
    assert "written before" not in run.stdout, run.stdout
    assert run.stdout.splitlines()[-1:] == ["[sim] main: exiting with code 0"], run.stdout
