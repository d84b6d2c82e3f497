"""Stories of simulated Kueue: queueing beyond quota, positions, preemption and re-admission."""

from __future__ import annotations

import functools
from typing import Any, Callable

import pytest

from simulators.cluster.controllers import UnknownQueue
from tests.simulators.cluster.controllers.conftest import Sim, rjob, small_cluster_queue


def _is_admitted(sim: Sim, name: str) -> bool:
    wl = sim.workload_of(name)
    cond = sim.condition(wl, "Admitted")
    return bool(cond and cond["status"] == "True")


def test_it_queues_jobsets_beyond_quota_and_reports_positions(make_sim: Callable[..., Sim]) -> None:
    sim: Sim = make_sim(clusterQueues=small_cluster_queue("2"))
    for name in ("q1", "q2", "q3", "q4"):
        sim.create_jobset(name, [rjob("main", script="pull=0s;run=forever")])
        sim.eventually(functools.partial(sim.workload_of, name), what=f"{name} workload")
    sim.eventually(lambda: _is_admitted(sim, "q1") and _is_admitted(sim, "q2"), what="first two admitted")

    def pending_names() -> list[str]:
        return [i["metadata"]["ownerReferences"][0]["name"] for i in sim.ctrls.pending_workloads("cluster-queue")]

    sim.eventually(lambda: pending_names() == ["q3", "q4"], what="q3, q4 pending in FIFO order")
    items = sim.ctrls.pending_workloads("cluster-queue")
    assert [(i["positionInClusterQueue"], i["positionInLocalQueue"], i["localQueueName"], i["priority"]) for i in items] == \
        [(0, 0, "cpu-queue", 0), (1, 1, "cpu-queue", 0)]
    assert items[0]["metadata"]["ownerReferences"][0]["kind"] == "JobSet"

    q3 = sim.workload_of("q3")
    cond = sim.eventually(lambda: sim.condition(sim.workload_of("q3"), "QuotaReserved"), what="q3 QuotaReserved=False")
    assert (cond["status"], cond["reason"]) == ("False", "WaitingForQuota")
    assert cond["message"] == "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor default-flavor, 1 more needed"
    assert sim.jobset("q3")["spec"]["suspend"] is True
    assert q3["status"].get("admission") is None

    # A high-priority arrival from another LocalQueue of the same ClusterQueue preempts a running one.
    sim.create_jobset("urgent", [rjob("main", script="pull=0s;run=forever")], queue="gpu-queue",
                      labels={"kueue.x-k8s.io/priority-class": "high"})
    sim.eventually(lambda: sim.workload_of("urgent") and sim.workload_of("urgent")["spec"]["priority"] == 1000,
                   what="urgent workload with priority 1000")
    # urgent preempts one of the running low-priority workloads and is admitted once it is stopped.
    sim.eventually(lambda: _is_admitted(sim, "urgent"), timeout=10, what="urgent admitted")

    lq_items = sim.ctrls.pending_workloads(namespace="default", local_queue="cpu-queue")
    assert [i["positionInLocalQueue"] for i in lq_items] == list(range(len(lq_items)))
    assert len(lq_items) == 3, "q3, q4 and the preempted one wait in cpu-queue"
    assert sim.ctrls.pending_workloads(namespace="default", local_queue="gpu-queue") == []

    lq = sim.eventually(lambda: (sim.get("localqueues", "cpu-queue") or {}).get("status", {}).get("pendingWorkloads") == 3
                        and sim.get("localqueues", "cpu-queue"), what="LocalQueue status")
    assert lq["status"]["admittedWorkloads"] == 1
    cq = sim.eventually(lambda: (sim.get("clusterqueues", "cluster-queue", None) or {}).get("status", {}).get("admittedWorkloads") == 2
                        and sim.get("clusterqueues", "cluster-queue", None), what="ClusterQueue status")
    assert cq["status"]["pendingWorkloads"] == 3
    usage = {r["name"]: r["total"] for r in cq["status"]["flavorsUsage"][0]["resources"]}
    assert usage["cpu"] == "2"

    with pytest.raises(UnknownQueue):
        sim.ctrls.pending_workloads(namespace="default", local_queue="nope")


def test_it_preempts_a_running_low_priority_jobset_and_readmits_it_later(make_sim: Callable[..., Sim]) -> None:
    sim: Sim = make_sim(clusterQueues=small_cluster_queue("4"))
    sim.create_jobset("low", [rjob("workers", replicas=2, pods=2, script="pull=0s;run=forever")],
                      labels={"kueue.x-k8s.io/priority-class": "low"})
    sim.eventually(lambda: sim.counters("low")["workers"]["ready"] == 2, what="low running")

    sim.create_jobset("high", [rjob("workers", replicas=2, pods=2, script="pull=0s;run=20s;exit=0")],
                      labels={"kueue.x-k8s.io/priority-class": "high"})

    # Phase 1: low is evicted; its JobSet is suspended and its counters drop to zero.
    def low_evicted_and_stopped() -> bool:
        wl = sim.workload_of("low")
        ev = sim.condition(wl, "Evicted")
        return bool(ev and ev["status"] == "True" and sim.jobset("low")["spec"]["suspend"]
                    and sim.counters("low")["workers"]["active"] == 0)

    sim.eventually(low_evicted_and_stopped, what="low evicted and stopped")
    wl = sim.eventually(lambda: sim.workload_of("low").get("status", {}).get("admission") is None and sim.workload_of("low"),
                        what="low quota released")
    conds = {c["type"]: c for c in wl["status"]["conditions"]}
    assert (conds["Evicted"]["status"], conds["Evicted"]["reason"]) == ("True", "Preempted")
    assert (conds["Preempted"]["status"], conds["Preempted"]["reason"]) == ("True", "InClusterQueue")
    assert conds["Preempted"]["message"].startswith("Preempted to accommodate a workload (UID: ")
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("True", "Preempted")
    # PendingEvaluation when the quota is released, then the next scheduling attempt's verdict.
    assert conds["QuotaReserved"]["status"] == "False"
    assert conds["QuotaReserved"]["reason"] in ("PendingEvaluation", "WaitingForQuota")
    assert (conds["Admitted"]["status"], conds["Admitted"]["reason"]) == ("False", "NoReservation")
    assert sim.counters("low")["workers"] == {"name": "workers", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 2}
    assert sim.condition(sim.jobset("low"), "Suspended")["status"] == "True"
    assert "Stopped" in sim.reasons("JobSet", "low")

    # Phase 2: high runs to completion, then low is re-admitted with the same Jobs, restarts unchanged.
    sim.eventually(lambda: _is_admitted(sim, "high"), what="high admitted")
    low_jobs_before = {j["metadata"]["uid"] for j in sim.list("jobs", label_selector="jobset.sigs.k8s.io/jobset-name=low")}
    sim.eventually(lambda: sim.jobset("high")["status"].get("terminalState") == "Completed", timeout=10, what="high completed")
    sim.eventually(lambda: _is_admitted(sim, "low") and sim.counters("low")["workers"]["ready"] == 2, timeout=10,
                   what="low re-admitted and running")
    low = sim.jobset("low")
    assert low["status"]["restarts"] == 0
    assert sim.condition(low, "Suspended")["status"] == "False"
    wl = sim.workload_of("low")
    evicted = sim.condition(wl, "Evicted")
    assert (evicted["status"], evicted["reason"]) == ("False", "QuotaReserved")
    assert evicted["message"].startswith("Previously: Preempted to accommodate")
    assert {j["metadata"]["uid"] for j in sim.list("jobs", label_selector="jobset.sigs.k8s.io/jobset-name=low")} == low_jobs_before


def test_it_marks_workloads_of_a_missing_local_queue_inadmissible(sim: Sim) -> None:
    sim.create_jobset("lost", [rjob("main")], queue="no-such-queue")
    cond = sim.eventually(lambda: sim.condition(sim.workload_of("lost"), "QuotaReserved"), what="inadmissible verdict")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Misconfigured", "LocalQueue no-such-queue doesn't exist")
    assert sim.ctrls.pending_workloads("cluster-queue") == []


def test_it_defaults_the_queue_name_when_a_default_local_queue_exists(sim: Sim) -> None:
    sim.create_jobset("plainjane", [rjob("main", script="pull=0s;run=1s;exit=0")], queue=None)
    js = sim.jobset("plainjane")
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    assert js["spec"]["suspend"] is True
    sim.eventually(lambda: sim.jobset("plainjane")["status"].get("terminalState") == "Completed", what="completed")


def test_it_unsuspends_an_admitted_jobset_that_a_user_suspended(sim: Sim) -> None:
    sim.create_jobset("stubborn", [rjob("main", script="pull=0s;run=forever")])
    sim.eventually(lambda: sim.counters("stubborn")["main"]["ready"] == 1, what="running")
    sim.patch_jobset("stubborn", {"spec": {"suspend": True}})
    sim.eventually(lambda: "Started" in [e["reason"] for e in sim.events("JobSet", "stubborn") if e["count"] >= 2]
                   or sum(e["count"] for e in sim.events("JobSet", "stubborn") if e["reason"] == "Started") >= 2,
                   what="Kueue started it again")
    sim.eventually(lambda: sim.jobset("stubborn")["spec"]["suspend"] is False and sim.counters("stubborn")["main"]["ready"] == 1,
                   what="running again")


def test_it_rejects_spec_changes_of_a_running_jobset(sim: Sim) -> None:
    sim.create_jobset("frozen", [rjob("main", script="pull=0s;run=forever")])
    sim.eventually(lambda: sim.jobset("frozen")["spec"]["suspend"] is False, what="admitted")
    with pytest.raises(Exception) as err:
        sim.patch_jobset("frozen", {"spec": {"replicatedJobs": [rjob("main", replicas=3)]}})
    assert getattr(err.value, "code", None) == 422


def test_it_frees_the_quota_when_a_running_jobset_is_deleted(make_sim: Callable[..., Sim]) -> None:
    sim: Sim = make_sim(clusterQueues=small_cluster_queue("2"))
    sim.create_jobset("first", [rjob("main", pods=2, script="pull=0s;run=forever")])
    sim.eventually(lambda: sim.counters("first")["main"]["ready"] == 1, what="first running")
    sim.create_jobset("second", [rjob("main", pods=2, script="pull=0s;run=forever")])
    sim.eventually(lambda: sim.condition(sim.workload_of("second"), "QuotaReserved"), what="second waits")

    sim.store.delete("jobsets", "default", "first", propagation_policy="Foreground")
    sim.eventually(lambda: sim.get("jobsets", "first") is None, what="first gone")
    sim.eventually(lambda: not [w for w in sim.list("workloads") if w["metadata"]["name"].startswith("jobset-first-")],
                   what="first's workload gone (finalizer released)")
    sim.eventually(lambda: _is_admitted(sim, "second") and sim.counters("second")["main"]["ready"] == 1,
                   what="second admitted and running")
    assert not [p for p in sim.list("pods") if p["metadata"]["name"].startswith("first-")]


def test_it_stops_a_deactivated_workload_and_resumes_it_when_reactivated(sim: Sim) -> None:
    sim.create_jobset("napper", [rjob("main", script="pull=0s;run=forever")])
    sim.eventually(lambda: sim.counters("napper")["main"]["ready"] == 1, what="running")
    wl_name = sim.workload_of("napper")["metadata"]["name"]

    sim.store.patch("workloads", "default", wl_name, "merge", {"spec": {"active": False}})
    wl = sim.eventually(lambda: (w := sim.get("workloads", wl_name)) and not w["status"].get("admission") and w,
                        what="quota released")
    conds = {c["type"]: c for c in wl["status"]["conditions"]}
    assert (conds["Evicted"]["status"], conds["Evicted"]["reason"]) == ("True", "Deactivated")
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("False", "Deactivated")
    assert sim.jobset("napper")["spec"]["suspend"] is True
    assert sim.counters("napper")["main"]["active"] == 0
    assert sim.ctrls.pending_workloads("cluster-queue") == [], "an inactive workload is not queued"

    sim.store.patch("workloads", "default", wl_name, "merge", {"spec": {"active": True}})
    sim.eventually(lambda: sim.counters("napper")["main"]["ready"] == 1 and not sim.jobset("napper")["spec"]["suspend"],
                   what="running again")
    conds = {c["type"]: c for c in sim.get("workloads", wl_name)["status"]["conditions"]}
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("True", "Reactivated")
    assert (conds["Evicted"]["status"], conds["Evicted"]["reason"]) == ("False", "QuotaReserved")


def _wait_for_pods_ready(limit: int | None) -> dict[str, Any]:
    return {"granularReasons": True, "waitForPodsReady": {
        "enable": True, "timeout": "20s",
        "requeuingStrategy": {"backoffBaseSeconds": 10, "backoffLimitCount": limit}}}


def test_it_reports_pods_ready_when_wait_for_pods_ready_is_on(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(kueue=_wait_for_pods_ready(None))
    sim.create_jobset("eager", [rjob("main", replicas=2, script="pull=2s;run=forever")])
    cond = sim.eventually(lambda: (c := sim.condition(sim.workload_of("eager"), "PodsReady")) and c["status"] == "True" and c,
                          what="PodsReady=True")
    assert cond["reason"] == "Started"


def test_it_evicts_on_pods_ready_timeout_with_backoff_then_deactivates(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(kueue=_wait_for_pods_ready(1))
    sim.create_jobset("stuck", [rjob("main", script="pull=fail:ImagePullBackOff")])
    first = sim.eventually(lambda: (w := sim.workload_of("stuck")) and (w["status"].get("requeueState") or {}).get("count") == 1
                           and not w["status"].get("admission") and w, what="first timeout eviction released")
    conds = {c["type"]: c for c in first["status"]["conditions"]}
    assert (conds["Evicted"]["reason"], conds["Evicted"]["message"]) == ("PodsReadyTimeout", f"Exceeded the PodsReady timeout default/{first['metadata']['name']}")
    assert (conds["PodsReady"]["status"], conds["PodsReady"]["reason"]) == ("False", "WaitForStart")
    assert sim.jobset("stuck")["spec"]["suspend"] is True

    # The back-off ends, it is admitted again, times out again and is deactivated (limit 1).
    last = sim.eventually(lambda: (w := sim.workload_of("stuck")) and w["spec"].get("active") is False
                          and not w["status"].get("admission") and w, timeout=15, what="deactivated")
    conds = {c["type"]: c for c in last["status"]["conditions"]}
    assert conds["Evicted"]["reason"] == "DeactivatedDueToRequeuingLimitExceeded"
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("False", "DeactivatedDueToRequeuingLimitExceeded")
    assert sim.jobset("stuck")["spec"]["suspend"] is True
    assert {"EvictedDueToPodsReadyTimeout"} <= sim.reasons("Workload", last["metadata"]["name"])


def test_it_counts_in_the_queue_status_the_workloads_the_same_cycle_admitted(make_sim: Callable[..., Sim]) -> None:
    """The ClusterQueue's status written at the end of an admission cycle counts what that cycle admitted.

    Without waitForPodsReady nothing writes a Workload after its admission, so a status taken from the
    cycle's opening snapshot (before the admissions) would say "0 admitted" until some other change.
    """
    sim: Sim = make_sim(clusterQueues=small_cluster_queue("2"), kueue={"waitForPodsReady": {"enable": False}})
    sim.ctrls.scheduler.opts.status_interval_wall = 0.0  # every cycle writes the status: no timer to hide it
    for name in ("a", "b"):
        sim.create_jobset(name, [rjob("main", script="pull=0s;run=forever")])
    sim.eventually(lambda: _is_admitted(sim, "a") and _is_admitted(sim, "b"), what="both admitted")
    sim.eventually(lambda: sim.get("clusterqueues", "cluster-queue", None)["status"]["admittedWorkloads"] == 2,
                   what="the ClusterQueue's status counting both")
    sim.eventually(lambda: sim.get("localqueues", "cpu-queue")["status"]["admittedWorkloads"] == 2,
                   what="the LocalQueue's status counting both")
