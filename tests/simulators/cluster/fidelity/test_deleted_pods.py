"""A deleted pod counts as a failed pod (kubernetes pkg/controller/job/job_controller.go
`isPodFailed`), and a Job's terminal condition waits for its pods: FailureTarget /
SuccessCriteriaMet first, Failed / Complete once no pod is left terminating."""

from __future__ import annotations

from typing import Any

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def _job_condition_history(kube_cluster: Cluster, job_name: str) -> list[list[tuple[str, str]]]:
    seen: list[list[tuple[str, str]]] = []

    def listener(event: str, rt: Any, obj: Any) -> None:
        if rt.plural == "jobs" and obj["metadata"]["name"] == job_name:
            conds = [(c["type"], c["status"]) for c in (obj.get("status") or {}).get("conditions") or []]
            if not seen or seen[-1] != conds:
                seen.append(conds)

    kube_cluster.handle.store.add_listener(listener)
    return seen


def test_it_counts_a_kubectl_deleted_pod_as_failed_and_fails_the_job_after_its_pods_are_gone(kube_cluster: Cluster) -> None:
    history = _job_condition_history(kube_cluster, "victim-main-0")
    kube_cluster.create_jobset("victim", [rjob("main", pods=2, script="pull=0s;run=forever", backoff_limit=0)])
    kube_cluster.eventually(lambda: kube_cluster.jobset("victim")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")
    pod = kube_cluster.pods(selector="batch.kubernetes.io/job-completion-index=0")[0].metadata.name

    kube_cluster.kubectl("delete", "pod", pod, "--wait=false")

    job = kube_cluster.eventually(lambda: (j := kube_cluster.job("victim-main-0")) and any(c.type == "Failed" for c in j.status.conditions or [])
                             and j, what="Job Failed")
    conds = {c.type: c for c in job.status.conditions}
    assert (conds["FailureTarget"].reason, conds["Failed"].reason) == ("BackoffLimitExceeded", "BackoffLimitExceeded")
    # The other pod was still running when the Job failed: it counts as failed too.
    assert job.status.failed == 2 and job.status.active == 0
    assert not kube_cluster.pods(selector="batch.kubernetes.io/job-name=victim-main-0") or all(
        p.metadata.deletion_timestamp or p.status.phase == "Failed" for p in kube_cluster.pods(selector="batch.kubernetes.io/job-name=victim-main-0"))
    # FailureTarget was written (and observed) before Failed.
    target_first = next(i for i, h in enumerate(history) if ("FailureTarget", "True") in h)
    failed_first = next(i for i, h in enumerate(history) if ("Failed", "True") in h)
    assert target_first < failed_first
    assert ("Failed", "True") not in history[target_first]
    js = kube_cluster.eventually(lambda: (j := kube_cluster.jobset("victim")) and j["status"].get("terminalState") and j, what="JobSet failed")
    assert js["status"]["terminalState"] == "Failed"
    assert kube_cluster.cond(js, "Failed")["reason"] == "FailedJobs"


def test_it_replaces_a_deleted_pod_within_the_backoff_limit_and_restarts_the_jobset_past_it(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("drained", [rjob("main", script="pull=0s;run=forever", backoff_limit=1)],
                          failurePolicy={"maxRestarts": 2})
    kube_cluster.eventually(lambda: kube_cluster.jobset("drained")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")
    first = kube_cluster.pods()[0].metadata.name
    kube_cluster.core.delete_namespaced_pod(first, "default")
    # Within backoffLimit 1: replaced (after the 10 s pod back-off), failed == 1, no JobSet restart.
    kube_cluster.eventually(lambda: (ps := [p for p in kube_cluster.pods() if not p.metadata.deletion_timestamp])
                       and ps[0].metadata.name != first and ps[0].status.phase == "Running", what="replacement running")
    assert kube_cluster.job("drained-main-0").status.failed == 1
    assert kube_cluster.jobset("drained")["status"].get("restarts", 0) == 0
    # A second deletion exceeds the limit: the Job fails and the JobSet restarts.
    second = [p for p in kube_cluster.pods() if not p.metadata.deletion_timestamp][0].metadata.name
    kube_cluster.core.delete_namespaced_pod(second, "default")
    js = kube_cluster.eventually(lambda: (j := kube_cluster.jobset("drained")) and j["status"].get("restarts") == 1 and j, what="JobSet restart")
    assert kube_cluster.cond(js, "Failed") is None


def test_it_does_not_count_pods_removed_by_a_suspend(kube_cluster: Cluster) -> None:
    # A namespace without a default LocalQueue: the JobSet is not Kueue-managed, so a user suspend sticks.
    kube_cluster.core.create_namespace({"metadata": {"name": "free"}})
    kube_cluster.create_jobset("paused", [rjob("main", script="pull=0s;run=forever", backoff_limit=0)], queue=None, namespace="free")
    kube_cluster.eventually(lambda: kube_cluster.jobset("paused", "free")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")
    kube_cluster.custom.patch_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "free", "jobsets", "paused", {"spec": {"suspend": True}})
    kube_cluster.eventually(lambda: not kube_cluster.pods("free"), what="pods removed by the suspend")
    job = kube_cluster.job("paused-main-0", "free")
    assert job.status.failed in (0, None)
    assert not any(c.type in ("Failed", "FailureTarget") for c in job.status.conditions or [])


def test_it_marks_success_criteria_met_before_complete(kube_cluster: Cluster) -> None:
    history = _job_condition_history(kube_cluster, "quick-main-0")
    kube_cluster.create_jobset("quick", [rjob("main", script="pull=0s;run=2s;exit=0")])
    kube_cluster.eventually(lambda: kube_cluster.jobset("quick")["status"].get("terminalState") == "Completed", what="completed")
    met = next(i for i, h in enumerate(history) if ("SuccessCriteriaMet", "True") in h)
    complete = next(i for i, h in enumerate(history) if ("Complete", "True") in h)
    assert met < complete
