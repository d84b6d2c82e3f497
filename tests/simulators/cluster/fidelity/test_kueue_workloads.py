"""Kueue Workload details as upstream: pending conditions and resourceRequests, deactivating a
pending Workload, a JobSet deleted under its Workload's finalizer, unknown priority classes."""

from __future__ import annotations

from typing import Any, Callable

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob

SMALL_CQ = [{
    "name": "cluster-queue",
    "preemption": {"withinClusterQueue": "LowerPriority"},
    "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
        {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "2"}, {"name": "memory", "nominalQuota": "8Gi"}]}]}],
}]


def _conds(obj: Any) -> dict[str, Any]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def test_it_marks_pending_workloads_not_admitted_with_resource_requests_and_a_warning(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=SMALL_CQ)
    kube_cluster.create_jobset("big", [rjob("main", replicas=2, pods=2, cpu="1", script="run=forever")])
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("big")) and kube_cluster.cond(w, "QuotaReserved")
                            and kube_cluster.cond(w, "PodsReady") and w, what="pending verdict")
    c = _conds(wl)
    assert (c["QuotaReserved"]["status"], c["QuotaReserved"]["reason"]) == ("False", "ExceedsMaxQuota")
    assert (c["Admitted"]["status"], c["Admitted"]["reason"], c["Admitted"]["message"]) == ("False", "NoReservation", "The workload has no reservation")
    assert (c["PodsReady"]["status"], c["PodsReady"]["reason"]) == ("False", "WaitForStart")
    assert wl["status"]["resourceRequests"] == [{"name": "main", "resources": {"cpu": "4"}}]
    pending = [e for e in kube_cluster.events("Workload", wl["metadata"]["name"]) if e.reason == "Pending"]
    assert pending and all(e.type == "Warning" for e in pending)


def test_it_evicts_a_deactivated_pending_workload(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=SMALL_CQ)
    kube_cluster.create_jobset("waiting", [rjob("main", pods=3, cpu="1", script="run=forever")])
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("waiting")) and kube_cluster.cond(w, "QuotaReserved") and w, what="pending")
    name = wl["metadata"]["name"]
    kube_cluster.kubectl("patch", "workloads.kueue.x-k8s.io", name, "--type=merge", "-p", '{"spec":{"active":false}}')
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("waiting")) and (e := kube_cluster.cond(w, "Evicted")) and e["status"] == "True" and w,
                            what="evicted")
    c = _conds(wl)
    assert (c["Evicted"]["reason"], c["Evicted"]["message"]) == ("Deactivated", "The workload is deactivated")
    assert (c["QuotaReserved"]["status"], c["QuotaReserved"]["reason"]) == ("False", "Deactivated")
    assert any(e.reason == "EvictedDueToDeactivated" for e in kube_cluster.events("Workload", name))
    assert kube_cluster.handle.controllers.pending_workloads("cluster-queue") == []


def test_it_finishes_the_workload_with_owner_not_found_when_the_jobset_is_deleted(kube_cluster: Cluster) -> None:
    seen: list[dict[str, Any]] = []
    kube_cluster.handle.store.add_listener(lambda event, rt, obj: seen.append(obj) if rt.plural == "workloads" else None)
    kube_cluster.create_jobset("doomed", [rjob("main", script="run=forever")])
    kube_cluster.eventually(lambda: kube_cluster.jobset("doomed")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")
    name = kube_cluster.workload_of("doomed")["metadata"]["name"]
    kube_cluster.kubectl("delete", "jobset", "doomed", "--wait=false")
    kube_cluster.eventually(lambda: not kube_cluster.workloads(), what="workload gone")
    finished = [c for w in seen if w["metadata"]["name"] == name for c in (w.get("status") or {}).get("conditions") or []
                if c["type"] == "Finished" and c["status"] == "True"]
    assert finished and (finished[-1]["reason"], finished[-1]["message"]) == ("OwnerNotFound", "The workload's owner no longer exists")
    cq = kube_cluster.eventually(lambda: (q := kube_cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", "cluster-queue"))
                            and q["status"].get("reservingWorkloads") == 0 and q, what="quota freed")
    assert cq["status"]["admittedWorkloads"] == 0


def test_it_creates_no_workload_for_an_unknown_workload_priority_class(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("vip", [rjob("main")], labels={"kueue.x-k8s.io/priority-class": "platinum"})
    kube_cluster.eventually(lambda: any(e.reason == "WorkloadPriorityClassNotFound" for e in kube_cluster.events("JobSet", "vip")), what="event")
    ev = next(e for e in kube_cluster.events("JobSet", "vip") if e.reason == "WorkloadPriorityClassNotFound")
    assert ev.type == "Warning" and "platinum" in ev.message
    assert kube_cluster.workload_of("vip") is None
    assert kube_cluster.jobset("vip")["spec"]["suspend"] is True
    assert not kube_cluster.pods()


def test_it_creates_no_workload_for_an_unknown_priority_class(kube_cluster: Cluster) -> None:
    job = rjob("main")
    job["template"]["spec"]["template"]["spec"]["priorityClassName"] = "ultra"
    kube_cluster.create_jobset("vip2", [job])
    kube_cluster.eventually(lambda: any(e.reason == "PriorityClassNotFound" for e in kube_cluster.events("JobSet", "vip2")), what="event")
    assert kube_cluster.workload_of("vip2") is None
    assert kube_cluster.jobset("vip2")["spec"]["suspend"] is True
