"""stopPolicy on a ClusterQueue or LocalQueue: HoldAndDrain evicts admitted Workloads
(ClusterQueueStopped / LocalQueueStopped), Hold blocks admission; restarting requeues them."""

from __future__ import annotations

import json

import pytest

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def _conds(obj: dict) -> dict:  # type: ignore[type-arg]
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


@pytest.mark.parametrize("kind,target,reason", [
    ("clusterqueue", "cluster-queue", "ClusterQueue"),
    ("localqueue", "cpu-queue", "LocalQueue"),
])
def test_it_drains_and_restarts_a_stopped_queue(kube_cluster: Cluster, kind: str, target: str, reason: str) -> None:
    kube_cluster.create_jobset("worker", [rjob("main", script="pull=0s;run=forever")])
    kube_cluster.eventually(lambda: kube_cluster.jobset("worker")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")

    kube_cluster.kubectl("patch", kind, target, "--type=merge", "-p", json.dumps({"spec": {"stopPolicy": "HoldAndDrain"}}))
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("worker")) and not w["status"].get("admission")
                            and kube_cluster.cond(w, "Requeued") and w, what="drained")
    c = _conds(wl)
    assert (c["Evicted"]["status"], c["Evicted"]["reason"], c["Evicted"]["message"]) == ("True", f"{reason}Stopped", f"The {reason} is stopped")
    assert (c["Requeued"]["status"], c["Requeued"]["reason"]) == ("False", f"{reason}Stopped")
    assert kube_cluster.jobset("worker")["spec"]["suspend"] is True
    assert any(e.reason == f"EvictedDueTo{reason}Stopped" for e in kube_cluster.events("Workload", wl["metadata"]["name"]))

    # While stopped, a new JobSet stays pending.
    kube_cluster.create_jobset("later", [rjob("main", script="pull=0s;run=forever")])
    pending = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("later")) and kube_cluster.cond(w, "QuotaReserved") and w, what="pending")
    assert (kube_cluster.cond(pending, "QuotaReserved")["status"], kube_cluster.cond(pending, "QuotaReserved")["reason"]) == ("False", "Suspended")

    kube_cluster.kubectl("patch", kind, target, "--type=merge", "-p", json.dumps({"spec": {"stopPolicy": "None"}}))
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("worker")) and kube_cluster.cond(w, "Admitted")["status"] == "True" and w,
                            what="re-admitted")
    assert kube_cluster.cond(wl, "Requeued")["reason"] == f"{reason}Restarted"
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("later"), "Admitted")["status"] == "True", what="later admitted")
