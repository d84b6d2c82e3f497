"""Admission checks: quota reserved but Admitted=False/UnsatisfiedAdmissionChecks and the JobSet
stays suspended until every check is Ready (set here as an admission check controller would)."""

from __future__ import annotations

from typing import Any, Callable

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob

CQ_WITH_CHECK = [{
    "name": "cluster-queue", "admissionChecks": ["capacity"],
    "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "8"}]}]}],
}]


def test_it_holds_a_jobset_until_its_admission_check_is_ready(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=CQ_WITH_CHECK, admissionChecks=[{"name": "capacity"}])
    assert "capacity" in kube_cluster.kubectl("get", "admissionchecks", namespace=None).stdout
    kube_cluster.create_jobset("checked", [rjob("main", script="pull=0s;run=forever")])
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("checked")) and (q := kube_cluster.cond(w, "QuotaReserved"))
                            and q["status"] == "True" and w, what="quota reserved")
    adm = kube_cluster.cond(wl, "Admitted")
    assert (adm["status"], adm["reason"]) == ("False", "UnsatisfiedAdmissionChecks")
    assert [(c["name"], c["state"]) for c in wl["status"]["admissionChecks"]] == [("capacity", "Pending")]
    assert kube_cluster.jobset("checked")["spec"]["suspend"] is True
    assert not kube_cluster.pods()

    name = wl["metadata"]["name"]
    checks = [{**wl["status"]["admissionChecks"][0], "state": "Ready", "message": "capacity found"}]
    kube_cluster.custom.patch_namespaced_custom_object_status("kueue.x-k8s.io", "v1beta2", "default", "workloads", name,
                                                         {"status": {"admissionChecks": checks}})
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("checked"), "Admitted")["status"] == "True", what="admitted")
    kube_cluster.eventually(lambda: kube_cluster.jobset("checked")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")


def _set_check(kube_cluster: Cluster, name: str, **fields: object) -> None:
    wl = kube_cluster.custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "default", "workloads", name)
    checks = [{**wl["status"]["admissionChecks"][0], **fields}]
    kube_cluster.custom.patch_namespaced_custom_object_status("kueue.x-k8s.io", "v1beta2", "default", "workloads", name,
                                                         {"status": {"admissionChecks": checks}})


def _reserved(kube_cluster: Cluster, jobset: str) -> Any:
    return kube_cluster.eventually(lambda: (w := kube_cluster.workload_of(jobset)) and (q := kube_cluster.cond(w, "QuotaReserved"))
                              and q["status"] == "True" and w, what=f"{jobset} quota reserved")


def test_it_evicts_on_a_retry_check_requeues_after_its_delay_and_resets_the_checks(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=CQ_WITH_CHECK, admissionChecks=[{"name": "capacity"}])
    kube_cluster.create_jobset("retried", [rjob("main", script="pull=0s;run=forever")])
    name = _reserved(kube_cluster, "retried")["metadata"]["name"]
    _set_check(kube_cluster, name, state="Retry", message="no capacity yet", requeueAfterSeconds=120)

    message = 'Evicted due to AdmissionCheck in Retry state: "capacity" (no capacity yet)'
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("retried")) and (r := kube_cluster.cond(w, "Requeued"))
                            and (r["status"], r["reason"]) == ("False", "AdmissionCheck") and w, what="evicted and waiting")
    ev = kube_cluster.cond(wl, "Evicted")
    assert (ev["status"], ev["reason"], ev["message"]) == ("True", "AdmissionCheck", message)
    assert "admission" not in wl["status"] and wl["status"]["requeueState"]["requeueAt"]
    check = wl["status"]["admissionChecks"][0]
    assert (check["state"], check["message"], check["retryCount"]) == ("Pending", "Reset to Pending after eviction. Previously: Retry", 1)
    assert {"reason": "AdmissionCheck", "count": 1} in wl["status"]["schedulingStats"]["evictions"]
    assert any(e.reason == "EvictedDueToAdmissionCheck" and e.message == message for e in kube_cluster.events("Workload", name))

    # After requeueAfterSeconds (120 simulated seconds) it is back in the queue and reserves quota again.
    wl = _reserved(kube_cluster, "retried")
    assert kube_cluster.cond(wl, "Requeued")["reason"] == "BackoffFinished"
    assert (kube_cluster.cond(wl, "Admitted")["status"], wl["status"]["admissionChecks"][0]["state"]) == ("False", "Pending")
    _set_check(kube_cluster, name, state="Ready", message="")
    kube_cluster.eventually(lambda: kube_cluster.jobset("retried")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")


def test_it_deactivates_the_workload_on_a_rejected_check(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=CQ_WITH_CHECK, admissionChecks=[{"name": "capacity"}])
    kube_cluster.create_jobset("rejected", [rjob("main", script="pull=0s;run=forever")])
    name = _reserved(kube_cluster, "rejected")["metadata"]["name"]
    _set_check(kube_cluster, name, state="Rejected", message="too big")

    target = 'AdmissionCheck in Rejected state: "capacity" (too big)'
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("rejected")) and "admission" not in w["status"]
                            and kube_cluster.cond(w, "Requeued") and w, what="deactivated and released")
    assert wl["spec"]["active"] is False
    c = {t: kube_cluster.cond(wl, t) for t in ("Evicted", "Requeued", "QuotaReserved")}
    assert (c["Evicted"]["status"], c["Evicted"]["reason"], c["Evicted"]["message"]) == (
        "True", "DeactivatedDueToAdmissionCheck", f"The workload is deactivated due to {target}")
    assert (c["Requeued"]["status"], c["Requeued"]["reason"]) == ("False", "DeactivatedDueToAdmissionCheck")
    assert kube_cluster.cond(wl, "DeactivationTarget") is None
    assert {"reason": "Deactivated", "underlyingCause": "AdmissionCheck", "count": 1} in wl["status"]["schedulingStats"]["evictions"]
    kube_cluster.eventually(lambda: (q := kube_cluster.cond(kube_cluster.workload_of("rejected"), "QuotaReserved"))
                       and (q["status"], q["reason"], q["message"]) == ("False", "Deactivated", "The workload is deactivated"),
                       what="QuotaReserved=False/Deactivated")
    events = kube_cluster.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}").stdout
    assert "AdmissionCheckRejected" in events and "EvictedDueToDeactivatedDueToAdmissionCheck" in events
    warning = [e for e in kube_cluster.events("Workload", name) if e.reason == "AdmissionCheckRejected"]
    assert [(e.type, e.message) for e in warning] == [("Warning", f"Deactivated due to {target}")]
    assert kube_cluster.jobset("rejected")["spec"]["suspend"] is True and not kube_cluster.pods()
