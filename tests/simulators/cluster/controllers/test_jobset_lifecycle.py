"""Stories of a JobSet's life in the simulator: success, failure, restarts, policies, TTL, suspend."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

import pytest

from tests.simulators.cluster.controllers.conftest import Sim, rjob


def test_it_runs_a_queued_jobset_to_completion_with_real_names_and_labels(sim: Sim) -> None:
    # Admission waits until the JobSet controller has seen the JobSet suspended: the two run apart, as
    # upstream, and one that Kueue admitted first would never be seen suspended (no SuspendedJobs).
    sim.stop_policy("cpu-queue", "Hold")
    sim.create_jobset("alice", [rjob("workers", replicas=2, pods=2, script="pull=1s;run=3s;exit=0")])

    created = sim.jobset("alice")
    assert created["spec"]["suspend"] is True, "Kueue's webhook suspends a queued JobSet at creation"
    sim.eventually(lambda: "SuspendedJobs" in sim.reasons("JobSet", "alice"), what="alice seen suspended")
    sim.stop_policy("cpu-queue", "None")
    assert created["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": []}
    assert created["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMode"] == "Indexed"

    done = sim.eventually(lambda: sim.jobset("alice")["status"].get("terminalState") == "Completed" and sim.jobset("alice"),
                          what="alice completed")
    completed = sim.condition(done, "Completed")
    assert completed and (completed["status"], completed["reason"], completed["message"]) == \
        ("True", "AllJobsCompleted", "jobset completed successfully")
    assert sim.condition(done, "Suspended")["status"] == "False"
    assert sim.counters("alice")["workers"] == {"name": "workers", "ready": 0, "succeeded": 2, "failed": 0,
                                                "active": 0, "suspended": 0}
    assert done["status"]["restarts"] == 0

    jobs = {j["metadata"]["name"]: j for j in sim.list("jobs")}
    assert set(jobs) == {"alice-workers-0", "alice-workers-1"}
    job = jobs["alice-workers-1"]
    labels = job["metadata"]["labels"]
    assert labels["jobset.sigs.k8s.io/jobset-name"] == "alice"
    assert labels["jobset.sigs.k8s.io/jobset-uid"] == done["metadata"]["uid"]
    assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "workers"
    assert labels["jobset.sigs.k8s.io/job-index"] == "1"
    assert labels["jobset.sigs.k8s.io/global-replicas"] == "2"
    assert labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
    assert labels["jobset.sigs.k8s.io/job-key"] == hashlib.sha1(b"default/alice-workers-1").hexdigest()
    assert job["metadata"]["annotations"]["jobset.sigs.k8s.io/job-index"] == "1"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    assert sim.condition(job, "Complete")["status"] == "True"

    pods = sim.list("pods", label_selector="jobset.sigs.k8s.io/jobset-name=alice")
    assert len(pods) == 4
    for pod in pods:
        assert re.fullmatch(r"alice-workers-[01]-[01]-[a-z0-9]{5}", pod["metadata"]["name"])
        assert pod["status"]["phase"] == "Succeeded"
        assert pod["spec"]["nodeName"].startswith("sim-node-")
        assert pod["spec"]["subdomain"] == "alice"
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (term["exitCode"], term["reason"]) == (0, "Completed")
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "workers"
    one = pods[0]["metadata"]["name"]
    assert {"Scheduled", "Pulling", "Pulled", "Created", "Started"} <= sim.reasons("Pod", one)
    assert "exiting with code 0" in sim.ctrls.pod_log("default", one)

    wl = sim.eventually(lambda: sim.condition(sim.workload_of("alice"), "Finished") and sim.workload_of("alice"),
                        what="workload finished")
    assert wl["metadata"]["name"].startswith("jobset-alice-")
    assert sim.condition(wl, "Finished")["reason"] == "Succeeded"
    assert wl["status"]["admission"]["podSetAssignments"][0]["count"] == 4
    assert {"CreatedWorkload", "Started", "AllJobsCompleted", "SuspendedJobs", "ResumeJobs"} <= sim.reasons("JobSet", "alice")


def test_it_fails_the_jobset_on_the_first_job_failure_without_a_failure_policy(sim: Sim) -> None:
    sim.create_jobset("bob", [rjob("workers", replicas=2, script="pull=1s;run=2s;exit=1")])

    failed = sim.eventually(lambda: sim.jobset("bob")["status"].get("terminalState") == "Failed" and sim.jobset("bob"),
                            what="bob failed")
    cond = sim.condition(failed, "Failed")
    assert (cond["status"], cond["reason"]) == ("True", "FailedJobs")
    assert re.fullmatch(r"jobset failed due to one or more job failures \(first failed job: bob-workers-[01]\)", cond["message"])
    assert failed["status"]["restarts"] == 0
    assert sim.condition(failed, "RestartingJobSet") is None, "a JobSet never appends a False condition of a new type"
    first = cond["message"].rsplit(" ", 1)[1].rstrip(")")
    job = sim.get("jobs", first)
    failed_cond = sim.condition(job, "Failed")
    assert failed_cond and failed_cond["reason"] == "BackoffLimitExceeded"
    pod = sim.list("pods", label_selector=f"job-name={first}")[0]
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pod["status"]["phase"], term["exitCode"], term["reason"]) == ("Failed", 1, "Error")
    assert "FailedJobs" in sim.reasons("JobSet", "bob")


def test_it_restarts_the_whole_jobset_until_max_restarts_then_fails(sim: Sim) -> None:
    sim.create_jobset("carol", [rjob("workers", replicas=2, script="pull=0s;run=1s;exit=1")],
                      failurePolicy={"maxRestarts": 2})

    failed = sim.eventually(lambda: sim.jobset("carol")["status"].get("terminalState") == "Failed" and sim.jobset("carol"),
                            timeout=20, what="carol failed after restarts")
    st = failed["status"]
    assert (st["restarts"], st["restartsCountTowardsMax"]) == (2, 2)
    cond = sim.condition(failed, "Failed")
    assert cond["reason"] == "ReachedMaxRestarts"
    assert cond["message"].startswith("jobset failed due to reaching max number of restarts (first failed job: carol-workers-")
    restarting = sim.condition(failed, "RestartingJobSet")
    assert (restarting["status"], restarting["reason"]) == ("False", "JobSetFailed")
    attempts = {j["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for j in sim.list("jobs")}
    assert attempts == {"2"}, "jobs of previous attempts were deleted and recreated"
    assert "RestartJobSetFailurePolicyAction" in sim.reasons("JobSet", "carol")


def test_it_recovers_after_a_restart_when_the_script_heals(sim: Sim) -> None:
    sim.create_jobset("dave", [rjob("workers", script="pull=0s;run=1s;exit=1;heal=restarts:1")],
                      failurePolicy={"maxRestarts": 3})

    done = sim.eventually(lambda: sim.jobset("dave")["status"].get("terminalState") and sim.jobset("dave"),
                          timeout=15, what="dave finished")
    assert done["status"]["terminalState"] == "Completed"
    assert done["status"]["restarts"] == 1
    restarting = sim.condition(done, "RestartingJobSet")
    assert (restarting["status"], restarting["reason"]) == ("False", "JobSetCompleted")


def test_it_applies_fail_jobset_rules_before_restarting(sim: Sim) -> None:
    sim.create_jobset("erin", [rjob("workers", script="pull=0s;run=1s;exit=1")], failurePolicy={
        "maxRestarts": 5,
        "rules": [{"action": "FailJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]}],
    })
    failed = sim.eventually(lambda: sim.jobset("erin")["status"].get("terminalState") == "Failed" and sim.jobset("erin"),
                            what="erin failed")
    assert sim.condition(failed, "Failed")["reason"] == "FailJobSetFailurePolicyAction"
    assert failed["status"]["restarts"] == 0
    assert failed["spec"]["failurePolicy"]["rules"][0]["name"] == "failurePolicyRule0"


def test_it_completes_on_any_success_of_the_targeted_replicated_job(sim: Sim) -> None:
    sim.create_jobset("frank", [
        rjob("driver", script="pull=0s;run=2s;exit=0"),
        rjob("workers", replicas=2, script="pull=0s;run=forever"),
    ], successPolicy={"operator": "Any", "targetReplicatedJobs": ["driver"]})

    done = sim.eventually(lambda: sim.jobset("frank")["status"].get("terminalState") == "Completed" and sim.jobset("frank"),
                          what="frank completed")
    assert sim.condition(done, "Completed")["reason"] == "AllJobsCompleted"
    # The still-running workers are cleaned up on the next passes.
    sim.eventually(lambda: not [j for j in sim.list("jobs") if j["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "workers"],
                   what="worker jobs deleted")
    sim.eventually(lambda: sim.list("pods", label_selector="jobset.sigs.k8s.io/replicatedjob-name=workers") == [],
                   what="worker pods deleted")


def test_it_creates_a_dependent_replicated_job_only_after_its_dependency_completes(sim: Sim) -> None:
    sim.create_jobset("grace", [
        rjob("prep", script="pull=0s;run=3s;exit=0"),
        rjob("train", replicas=2, script="pull=0s;run=1s;exit=0", depends_on=[{"name": "prep", "status": "Complete"}]),
    ])
    sim.eventually(lambda: sim.get("jobs", "grace-prep-0") and sim.get("jobs", "grace-prep-0")["status"].get("active"),
                   what="prep running")
    assert sim.get("jobs", "grace-train-0") is None, "train waits for prep"

    done = sim.eventually(lambda: sim.jobset("grace")["status"].get("terminalState") and sim.jobset("grace"),
                          what="grace finished")
    assert done["status"]["terminalState"] == "Completed"
    prep_done = sim.get("jobs", "grace-prep-0")["status"]["completionTime"]
    train_created = sim.get("jobs", "grace-train-0")["metadata"]["creationTimestamp"]
    assert train_created >= prep_done


def test_it_deletes_a_finished_jobset_and_its_children_after_the_ttl(sim: Sim) -> None:
    sim.create_jobset("heidi", [rjob("workers", script="pull=0s;run=1s;exit=0")], ttlSecondsAfterFinished=30)

    sim.eventually(lambda: sim.jobset("heidi")["status"].get("terminalState") == "Completed", what="heidi completed")
    finished_at = sim.clock.now()
    # Generous wall-clock bound: a loaded 2-core CI machine slows the clock threads.
    sim.eventually(lambda: sim.get("jobsets", "heidi") is None, timeout=30, what="heidi deleted by TTL")
    assert sim.clock.now() - finished_at >= 25
    sim.eventually(lambda: not sim.list("jobs") and not sim.list("pods") and not sim.list("workloads"),
                   what="children garbage-collected")


def test_it_suspends_and_resumes_a_jobset_outside_kueue(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(namespaces=["default", "plain"])
    sim.create_jobset("ivan", [rjob("workers", replicas=2, script="pull=0s;run=forever")], namespace="plain", queue=None)
    assert sim.jobset("ivan", "plain")["spec"].get("suspend") in (None, False), "no LocalQueue: Kueue leaves it alone"
    sim.eventually(lambda: sim.counters("ivan", "plain")["workers"]["ready"] == 2, what="ivan ready")

    sim.patch_jobset("ivan", {"spec": {"suspend": True}}, namespace="plain")
    sim.eventually(lambda: sim.counters("ivan", "plain")["workers"] == {"name": "workers", "ready": 0, "succeeded": 0,
                                                                         "failed": 0, "active": 0, "suspended": 2},
                   what="counters to zero")
    sim.eventually(lambda: sim.list("pods", "plain") == [], what="pods deleted")
    pod_events = [e for e in sim.list("events", "plain") if e["involvedObject"]["kind"] == "Pod"]
    assert "Killing" in {e["reason"] for e in pod_events}, "the kubelet stops containers of deleted pods"
    cond = sim.condition(sim.jobset("ivan", "plain"), "Suspended")
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "SuspendedJobs", "jobset is suspended")
    assert sim.condition(sim.get("jobs", "ivan-workers-0", "plain"), "Suspended")["reason"] == "JobSuspended"
    suspended_at = cond["lastTransitionTime"]

    sim.patch_jobset("ivan", {"spec": {"suspend": False}}, namespace="plain")
    sim.eventually(lambda: sim.counters("ivan", "plain")["workers"]["ready"] == 2, what="ivan ready again")
    cond = sim.condition(sim.jobset("ivan", "plain"), "Suspended")
    assert (cond["status"], cond["reason"]) == ("False", "ResumeJobs")
    assert cond["lastTransitionTime"] >= suspended_at
    assert sim.jobset("ivan", "plain")["status"]["restarts"] == 0


def test_it_restarts_beyond_max_restarts_when_the_rule_ignores_them(sim: Sim) -> None:
    sim.create_jobset("judy", [rjob("workers", script="pull=0s;run=1s;exit=1;heal=restarts:2")], failurePolicy={
        "maxRestarts": 0,
        "rules": [{"name": "always", "action": "RestartJobSetAndIgnoreMaxRestarts"}],
    })
    done = sim.eventually(lambda: sim.jobset("judy")["status"].get("terminalState") and sim.jobset("judy"),
                          timeout=15, what="judy finished")
    assert done["status"]["terminalState"] == "Completed"
    assert done["status"]["restarts"] == 2
    assert not done["status"].get("restartsCountTowardsMax")
    assert "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction" in sim.reasons("JobSet", "judy")


def test_it_fails_a_job_that_runs_past_its_active_deadline(sim: Sim) -> None:
    workers = rjob("workers", script="pull=0s;run=forever")
    workers["template"]["spec"]["activeDeadlineSeconds"] = 20
    sim.create_jobset("ken", [workers])
    failed = sim.eventually(lambda: sim.jobset("ken")["status"].get("terminalState") == "Failed" and sim.jobset("ken"),
                            timeout=10, what="ken failed")
    assert sim.condition(failed, "Failed")["reason"] == "FailedJobs"
    job_failed = sim.condition(sim.get("jobs", "ken-workers-0"), "Failed")
    assert (job_failed["reason"], job_failed["message"]) == ("DeadlineExceeded", "Job was active longer than specified deadline")
    sim.eventually(lambda: sim.list("pods") == [], what="pods of the failed job deleted")


def test_it_rejects_invalid_jobsets_at_creation(sim: Sim) -> None:
    cases: list[tuple[list[dict[str, Any]], dict[str, Any], str]] = [
        ([], {}, "spec.replicatedJobs"),
        ([rjob("a"), rjob("a")], {}, "Duplicate value"),
        ([rjob("a", depends_on=[{"name": "b", "status": "Ready"}])], {}, "first replicated job"),
        ([rjob("a")], {"successPolicy": {"operator": "All", "targetReplicatedJobs": ["nope"]}}, "must name a replicated job"),
        ([rjob("x" * 60)], {}, "RFC 1035"),
    ]
    for i, (rjobs, spec, needle) in enumerate(cases):
        with pytest.raises(Exception) as err:
            sim.create_jobset(f"bad{i}", rjobs, **spec)
        assert getattr(err.value, "code", None) == 422, needle
        assert needle in str(err.value)
    assert sim.list("jobsets") == []
