"""Admission checks: quota reserved but Admitted=False/UnsatisfiedAdmissionChecks and the JobSet
stays suspended until every check is Ready (set here as an admission check controller would)."""

from __future__ import annotations

from typing import Callable

from tests.sim_fidelity.conftest import Cluster, rjob

CQ_WITH_CHECK = [{
    "name": "cluster-queue", "admissionChecks": ["capacity"],
    "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "8"}]}]}],
}]


def test_it_holds_a_jobset_until_its_admission_check_is_ready(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(clusterQueues=CQ_WITH_CHECK, admissionChecks=[{"name": "capacity"}])
    assert "capacity" in cluster.kubectl("get", "admissionchecks", namespace=None).stdout
    cluster.create_jobset("checked", [rjob("main", script="pull=0s;run=forever")])
    wl = cluster.eventually(lambda: (w := cluster.workload_of("checked")) and (q := cluster.cond(w, "QuotaReserved"))
                            and q["status"] == "True" and w, what="quota reserved")
    adm = cluster.cond(wl, "Admitted")
    assert (adm["status"], adm["reason"]) == ("False", "UnsatisfiedAdmissionChecks")
    assert [(c["name"], c["state"]) for c in wl["status"]["admissionChecks"]] == [("capacity", "Pending")]
    assert cluster.jobset("checked")["spec"]["suspend"] is True
    assert not cluster.pods()

    name = wl["metadata"]["name"]
    checks = [{**wl["status"]["admissionChecks"][0], "state": "Ready", "message": "capacity found"}]
    cluster.custom.patch_namespaced_custom_object_status("kueue.x-k8s.io", "v1beta2", "default", "workloads", name,
                                                         {"status": {"admissionChecks": checks}})
    cluster.eventually(lambda: cluster.cond(cluster.workload_of("checked"), "Admitted")["status"] == "True", what="admitted")
    cluster.eventually(lambda: cluster.jobset("checked")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")
