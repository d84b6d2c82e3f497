"""Stories of the kubelet stand-in: scripted pods, image pull failures, crash loops, logs, the clock."""

from __future__ import annotations

import time
from typing import Any

import pytest

from simulators.cluster.clock import SimClock
from simulators.cluster.controllers import LogUnavailable
from simulators.cluster.controllers.script import Script, ScriptError, Timeline, parse_script
from tests.simulators.cluster.controllers.conftest import Sim, rjob


def _main_status(pod: Any) -> Any:
    return pod["status"]["containerStatuses"][0]


def test_it_reports_an_image_pull_failure_as_errimagepull_then_backoff(sim: Sim) -> None:
    sim.create_jobset("pully", [rjob("main", script="pull=fail:ImagePullBackOff")])
    pod = sim.eventually(lambda: [p for p in sim.list("pods")
                                  if (_main_status(p).get("state") or {}).get("waiting", {}).get("reason") == "ImagePullBackOff"]
                         if sim.list("pods") and sim.list("pods")[0]["status"].get("containerStatuses") else None,
                         what="ImagePullBackOff")[0]
    assert pod["status"]["phase"] == "Pending"
    assert _main_status(pod)["ready"] is False
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ContainersNotReady")
    name = pod["metadata"]["name"]
    sim.eventually(lambda: {"Pulling", "Failed", "BackOff"} <= sim.reasons("Pod", name), what="pull events")
    # The events of one timeline step are written one by one: wait for both messages.
    sim.eventually(lambda: {"Error: ErrImagePull", "Error: ImagePullBackOff"}
                   <= {e["message"] for e in sim.events("Pod", name) if e["reason"] == "Failed"}, what="Failed events")
    with pytest.raises(LogUnavailable, match="is waiting to start: trying and failing to pull image"):
        sim.ctrls.pod_log("default", name)
    # The retry loop keeps aggregating events rather than creating new ones.
    sim.eventually(lambda: any(e["count"] >= 2 for e in sim.events("Pod", name) if e["reason"] == "Pulling"),
                   what="repeated pull attempts")
    js = sim.jobset("pully")
    assert js["status"]["replicatedJobsStatus"][0]["ready"] == 0
    assert js["status"].get("terminalState") is None


def test_it_crash_loops_an_onfailure_pod_until_the_backoff_limit(sim: Sim) -> None:
    sim.create_jobset("loopy", [rjob("main", script="pull=0s;crash=every:2s", restart_policy="OnFailure", backoff_limit=2)])
    sim.eventually(lambda: any(_main_status(p)["restartCount"] >= 1 for p in sim.list("pods")
                               if p["status"].get("containerStatuses")), what="a restart")
    failed = sim.eventually(lambda: sim.jobset("loopy")["status"].get("terminalState") == "Failed" and sim.jobset("loopy"),
                            timeout=15, what="loopy failed")
    assert sim.condition(failed, "Failed")["reason"] == "FailedJobs"
    assert sim.condition(sim.get("jobs", "loopy-main-0"), "Failed")["reason"] == "BackoffLimitExceeded"
    assert "BackOff" in {e["reason"] for e in sim.list("events") if e["involvedObject"]["kind"] == "Pod"}


def test_it_serves_logs_of_the_current_and_previous_container(sim: Sim) -> None:
    sim.create_jobset("chatty", [rjob("main", script="pull=0s;run=forever;log=every:1s", restart_policy="OnFailure")])
    pod = sim.eventually(lambda: [p for p in sim.list("pods") if p["status"].get("phase") == "Running"], what="running")[0]
    name = pod["metadata"]["name"]
    text = sim.eventually(lambda: (t := sim.ctrls.pod_log("default", name)) and "working, 3s elapsed" in t and t, what="progress")
    assert text.startswith("[sim] main: started image=busybox:1.36 attempt=0\n")
    stamped = sim.ctrls.pod_log("default", name, timestamps=True, tail_lines=1)
    assert stamped.count("\n") == 1 and stamped[:4].isdigit() and "Z [sim] main:" in stamped
    with pytest.raises(LogUnavailable, match="previous terminated container"):
        sim.ctrls.pod_log("default", name, previous=True)
    with pytest.raises(LogUnavailable, match='container "nope" is not valid'):
        sim.ctrls.pod_log("default", name, container="nope")
    with pytest.raises(LookupError):
        sim.ctrls.pod_log("default", "no-such-pod")


def test_it_writes_ready_only_after_the_readiness_delay(sim: Sim) -> None:
    sim.create_jobset("slowready", [rjob("main", script="pull=0s;run=forever;ready=after:30s")])
    pod = sim.eventually(lambda: [p for p in sim.list("pods") if p["status"].get("phase") == "Running"], what="running")[0]
    assert _main_status(pod)["ready"] is False
    assert sim.counters("slowready")["main"]["ready"] == 0
    pod = sim.eventually(lambda: [p for p in sim.list("pods") if _main_status(p)["ready"]], what="ready")[0]
    conds = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conds["Ready"]["lastTransitionTime"] > conds["PodScheduled"]["lastTransitionTime"]
    sim.eventually(lambda: sim.counters("slowready")["main"]["ready"] == 1, what="jobset ready counter")


def test_it_parses_the_script_grammar() -> None:
    assert parse_script(None) == Script()
    s = parse_script("schedule=2s; pull=500ms; run=1m; exit=3; ready=after:3s; crash=every:10s,times:2; heal=restarts:1; log=every:2s")
    assert (s.schedule_delay, s.pull, s.run, s.exit_code, s.ready_after) == (2.0, 0.5, 60.0, 3, 3.0)
    assert (s.crash_every, s.crash_times, s.heal_restarts, s.log_every) == (10.0, 2, 1, 2.0)
    assert parse_script("pull=fail:ErrImagePull").pull_fail == "ErrImagePull"
    assert parse_script("pull=fail").pull_fail == "ImagePullBackOff"
    assert parse_script("run=forever;ready=never").run is None
    for bad in ("run", "run=fast", "exit=300", "pull=fail:Nope", "bogus=1", "ready=soon"):
        with pytest.raises(ScriptError):
            parse_script(bad)


def test_it_computes_a_crash_loop_timeline_with_growing_backoff() -> None:
    tl = Timeline(parse_script("pull=1s;crash=every:5s"), "OnFailure", 1000.0, "img", "main", "p_ns(uid)")
    # The first restart is immediate and counted when the new container starts.
    first_exit = tl.view(1006.0)
    assert "running" in first_exit.segment.state
    assert first_exit.segment.restart_count == 1
    assert first_exit.segment.last_state["terminated"]["exitCode"] == 1
    second_exit = tl.view(1011.0)
    assert second_exit.segment.state["waiting"]["reason"] == "CrashLoopBackOff"
    assert second_exit.segment.restart_count == 1
    assert second_exit.next_change == 1021.0  # then the 10 s back-off
    assert tl.view(1021.0).segment.restart_count == 2
    third = tl.view(1026.5)
    assert third.next_change == 1046.0  # then 20 s
    assert tl.view(2000.0).segment.phase == "Running"


def test_it_runs_the_clock_faster_than_wall_time() -> None:
    clock = SimClock(speed=20)
    try:
        start = clock.now()
        fired: list[float] = []
        clock.call_later(30, lambda: fired.append(clock.now()))
        t0 = time.monotonic()
        deadline = t0 + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        wall = time.monotonic() - t0
        assert fired and fired[0] - start >= 30
        assert 1.3 <= wall <= 2.5, "30 simulated seconds take 1.5 wall seconds at speed 20"
    finally:
        clock.stop()


def test_it_leaves_an_unschedulable_pod_pending(sim: Sim) -> None:
    sim.create_jobset("nowhere", [rjob("main", script="schedule=fail")])
    pod = sim.eventually(lambda: [p for p in sim.list("pods") if p["status"].get("conditions")], what="pod condition")[0]
    cond = pod["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert "nodeName" not in pod["spec"]
    assert "FailedScheduling" in sim.reasons("Pod", pod["metadata"]["name"])


def test_it_falls_back_to_the_default_behaviour_for_an_invalid_script(sim: Sim) -> None:
    sim.create_jobset("typo", [rjob("main", script="run=soon")])
    sim.eventually(lambda: sim.jobset("typo")["status"].get("terminalState") == "Completed", what="completed with defaults")
    pod_events = [e for e in sim.list("events") if e["involvedObject"]["kind"] == "Pod"]
    warning = [e for e in pod_events if e["reason"] == "InvalidSimScript"]
    assert warning and warning[0]["type"] == "Warning" and "bad duration 'soon'" in warning[0]["message"]


def test_it_makes_a_metrics_expression_reading_a_missing_argument_a_script_error_when_the_pod_starts(sim: Sim) -> None:
    job = rjob("main", script="run=1s;metrics=every:1s:loss=log(arg('lr'))")
    job["template"]["spec"]["template"]["spec"]["containers"][0]["args"] = ["--batch_size=32"]
    sim.create_jobset("noarg", [job])
    warning = sim.eventually(lambda: [e for e in sim.list("events") if e["reason"] == "InvalidSimScript"],
                             what="the script error")
    assert "arg('lr'): the container has no --lr=<number> argument" in warning[0]["message"]


def test_it_reports_a_terminated_container_before_confirming_a_deletion(sim: Sim) -> None:
    seen: list[dict[str, Any]] = []
    sim.store.add_listener(lambda event, rt, obj: seen.append(obj) if rt.plural == "pods" and event == "MODIFIED"
                           and obj["metadata"].get("deletionTimestamp") else None)
    sim.create_jobset("doomed", [rjob("main", script="pull=0s;run=forever", backoff_limit=1)])
    sim.eventually(lambda: sim.counters("doomed")["main"]["ready"] == 1, what="running")
    pod_name = sim.list("pods")[0]["metadata"]["name"]

    sim.store.delete("pods", "default", pod_name)
    sim.eventually(lambda: sim.get("pods", pod_name) is None, what="deletion confirmed by the kubelet")
    last = [p for p in seen if p["metadata"]["name"] == pod_name][-1]
    term = last["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (last["status"]["phase"], term["exitCode"], term["reason"]) == ("Failed", 143, "Error")
    assert "Killing" in sim.reasons("Pod", pod_name)
    # The Job replaces the deleted pod, and the deletion counts as a failed pod
    # (kubernetes job_controller.go isPodFailed), within backoffLimit 1.
    sim.eventually(lambda: sim.counters("doomed")["main"]["ready"] == 1 and len(sim.list("pods")) == 1, what="replacement")
    assert sim.get("jobs", "doomed-main-0")["status"]["failed"] == 1
