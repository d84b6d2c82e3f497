"""Cohorts: ClusterQueues with the same `cohortName` lend each other unused nominal quota, up to
`borrowingLimit` (kueue pkg/cache/scheduler/resource_node.go `available`), record it as `borrowed`
in their status, and take it back by preemption: `InCohortReclamation` when the owner reclaims
its nominal quota, `InCohortReclaimWhileBorrowing` when `borrowWithinCohort` lets a borrowing
ClusterQueue preempt lower-priority Workloads (kueue pkg/scheduler/preemption/preemption.go)."""

from __future__ import annotations

from typing import Any, Callable

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def _cq(name: str, cpu: str, *, borrowing_limit: str | None = None, cohort: str = "team", **preemption: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"name": "cpu", "nominalQuota": cpu}
    if borrowing_limit is not None:
        res["borrowingLimit"] = borrowing_limit
    return {"name": name, "cohortName": cohort, "preemption": {"withinClusterQueue": "Never", **preemption},
            "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{"name": "default-flavor", "resources": [res]}]}]}


def _lqs(*names: str) -> list[dict[str, str]]:
    return [{"name": f"{n}-queue", "namespace": "default", "clusterQueue": n} for n in names]


def _admitted(kube_cluster: Cluster, name: str) -> bool:
    wl = kube_cluster.workload_of(name)
    return bool(wl and (c := kube_cluster.cond(wl, "Admitted")) and c["status"] == "True")


def _cpu_usage(kube_cluster: Cluster, cq: str) -> dict[str, str]:
    obj = kube_cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", cq)
    cpu = obj["status"]["flavorsReservation"][0]["resources"][0]
    return {"total": cpu["total"], "borrowed": cpu["borrowed"]}


def test_it_lends_unused_quota_up_to_the_borrowing_limit_and_reclaims_it(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(
        clusterQueues=[_cq("team-a", "2", borrowing_limit="1", reclaimWithinCohort="Any"),
                       _cq("team-b", "2", reclaimWithinCohort="LowerPriority")],
        localQueues=_lqs("team-a", "team-b"))
    forever = "pull=0s;run=forever"
    for i in range(4):
        kube_cluster.create_jobset(f"a{i}", [rjob("main", script=forever)], queue="team-a-queue", labels={"kueue.x-k8s.io/priority-class": "low"})
        kube_cluster.eventually(lambda: _admitted(kube_cluster, f"a{i}") or i == 3, what=f"a{i} admitted")
    # a0, a1 in the nominal quota, a2 borrowed from team-b; a3 is past the borrowing limit of 1.
    kube_cluster.eventually(lambda: _cpu_usage(kube_cluster, "team-a") == {"total": "3", "borrowed": "1"}, what="team-a borrowing 1 cpu")
    pending = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("a3")) and (c := kube_cluster.cond(w, "QuotaReserved"))
                                 and c["status"] == "False" and c, what="a3 pending")
    assert pending["reason"] == "WaitingForQuota"
    assert pending["message"] == "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor default-flavor, 1 more needed"
    assert _cpu_usage(kube_cluster, "team-b") == {"total": "0", "borrowed": "0"}
    assert "team" in kube_cluster.kubectl("get", "clusterqueue", "team-a", namespace=None).stdout  # COHORT column

    # team-b wants its 2 cpus back: the most recently admitted lower-priority Workload of team-a goes.
    kube_cluster.create_jobset("b0", [rjob("main", cpu="2", script=forever)], queue="team-b-queue",
                          labels={"kueue.x-k8s.io/priority-class": "high"})
    kube_cluster.eventually(lambda: _admitted(kube_cluster, "b0"), what="b0 admitted")
    preemptor = kube_cluster.workload_of("b0")
    victim = kube_cluster.workload_of("a2")
    evicted, preempted = kube_cluster.cond(victim, "Evicted"), kube_cluster.cond(victim, "Preempted")
    message = (f"Preempted to accommodate a workload (UID: {preemptor['metadata']['uid']}, "
               f"JobUID: {kube_cluster.jobset('b0')['metadata']['uid']}) due to reclamation within the cohort; "
               "preemptor path: /team/team-b; preemptee path: /team/team-a")
    assert (evicted["status"], evicted["reason"], evicted["message"]) == ("True", "Preempted", message)
    assert (preempted["status"], preempted["reason"], preempted["message"]) == ("True", "InCohortReclamation", message)
    assert {"reason": "Preempted", "count": 1} in victim["status"]["schedulingStats"]["evictions"]
    reasons = {e.reason: e.message for e in kube_cluster.events("Workload", victim["metadata"]["name"])}
    assert reasons["EvictedDueToPreempted"] == message
    assert reasons["Preempted"].startswith(message + "; preemptor effective priority: 1000 (base: 1000, boost: 0)")
    assert any(e.reason == "PreemptedWorkload" for e in kube_cluster.events("Workload", preemptor["metadata"]["name"]))
    assert all(_admitted(kube_cluster, n) for n in ("a0", "a1"))
    kube_cluster.eventually(lambda: kube_cluster.jobset("a2")["spec"]["suspend"] is True, what="a2 stopped")
    kube_cluster.eventually(lambda: _cpu_usage(kube_cluster, "team-b") == {"total": "2", "borrowed": "0"}
                       and _cpu_usage(kube_cluster, "team-a") == {"total": "2", "borrowed": "0"}, what="quota given back")
    out = kube_cluster.kubectl("get", "workloads").stdout
    assert out.count("team-a") >= 2 and "team-b" in out


def test_it_does_not_reclaim_when_the_policy_is_never(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=[_cq("team-a", "1"), _cq("team-b", "1")], localQueues=_lqs("team-a", "team-b"))
    kube_cluster.create_jobset("a0", [rjob("main", cpu="2", script="pull=0s;run=forever")], queue="team-a-queue")
    kube_cluster.eventually(lambda: _admitted(kube_cluster, "a0"), what="a0 borrows team-b's cpu")
    kube_cluster.create_jobset("b0", [rjob("main", script="pull=0s;run=forever")], queue="team-b-queue",
                          labels={"kueue.x-k8s.io/priority-class": "high"})
    pending = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("b0")) and (c := kube_cluster.cond(w, "QuotaReserved"))
                                 and c["status"] == "False" and c, what="b0 pending")
    assert pending["reason"] == "WaitingForQuota"
    assert kube_cluster.cond(kube_cluster.workload_of("a0"), "Evicted") is None
    # The maximum capacity of a ClusterQueue includes what its cohort could lend it.
    kube_cluster.create_jobset("huge", [rjob("main", cpu="3", script="pull=0s;run=forever")], queue="team-b-queue")
    too_big = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("huge")) and (c := kube_cluster.cond(w, "QuotaReserved"))
                                 and c["status"] == "False" and c, what="huge pending")
    assert (too_big["reason"], too_big["message"]) == (
        "ExceedsMaxQuota", "couldn't assign flavors to pod set main: insufficient quota for cpu in flavor default-flavor, "
        "previously considered podsets requests (0) + current podset request (3) > maximum capacity (2)")


def test_it_preempts_while_borrowing_below_the_priority_threshold(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(
        clusterQueues=[_cq("team-a", "2"),
                       _cq("team-b", "2", reclaimWithinCohort="LowerPriority",
                           borrowWithinCohort={"policy": "LowerPriority", "maxPriorityThreshold": 100}),
                       _cq("spare", "2")],
        localQueues=_lqs("team-a", "team-b"))
    forever = "pull=0s;run=forever"
    for i in range(5):  # 2 nominal + 3 borrowed (team-b's 2 and one of spare's)
        kube_cluster.create_jobset(f"a{i}", [rjob("main", script=forever)], queue="team-a-queue", labels={"kueue.x-k8s.io/priority-class": "low"})
        kube_cluster.eventually(lambda: _admitted(kube_cluster, f"a{i}"), what=f"a{i} admitted")
    # 3 cpus for team-b: 2 nominal + 1 borrowed, so two of team-a's borrowed Workloads must go.
    kube_cluster.create_jobset("b0", [rjob("main", cpu="3", script=forever)], queue="team-b-queue",
                          labels={"kueue.x-k8s.io/priority-class": "high"})
    kube_cluster.eventually(lambda: _admitted(kube_cluster, "b0"), what="b0 admitted")
    victims = [n for n in ("a0", "a1", "a2", "a3", "a4") if kube_cluster.cond(kube_cluster.workload_of(n), "Preempted")]
    assert victims == ["a3", "a4"]  # the most recently admitted first
    for n in victims:
        c = kube_cluster.cond(kube_cluster.workload_of(n), "Preempted")
        assert c["reason"] == "InCohortReclaimWhileBorrowing"
        assert "due to reclamation within the cohort while borrowing; preemptor path: /team/team-b; preemptee path: /team/team-a" in c["message"]
    kube_cluster.eventually(lambda: _cpu_usage(kube_cluster, "team-b") == {"total": "3", "borrowed": "1"}, what="team-b borrowing 1")


def test_it_lends_no_more_than_the_lending_limit(make_kube_cluster: Callable[..., Cluster]) -> None:
    lender = _cq("team-a", "3")
    lender["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] = "1"
    kube_cluster = make_kube_cluster(clusterQueues=[lender, _cq("team-b", "1")], localQueues=_lqs("team-a", "team-b"))
    for i in range(3):
        kube_cluster.create_jobset(f"b{i}", [rjob("main", script="pull=0s;run=forever")], queue="team-b-queue")
    kube_cluster.eventually(lambda: _admitted(kube_cluster, "b0") and _admitted(kube_cluster, "b1"), what="b0 and b1 admitted")
    kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("b2")) and (c := kube_cluster.cond(w, "QuotaReserved"))
                       and (c["status"], c["reason"]) == ("False", "WaitingForQuota"), what="b2 pending")
    kube_cluster.eventually(lambda: _cpu_usage(kube_cluster, "team-b") == {"total": "2", "borrowed": "1"}, what="team-b borrowing 1")
    # team-a still has its 2 unlent cpus.
    kube_cluster.create_jobset("a0", [rjob("main", cpu="2", script="pull=0s;run=forever")], queue="team-a-queue")
    kube_cluster.eventually(lambda: _admitted(kube_cluster, "a0"), what="a0 admitted")
