"""Pod failure scenarios from the script: OOMKilled, container creation/start errors,
kubelet eviction and a lost node (DisruptionTarget, stuck Terminating)."""

from __future__ import annotations

from typing import Any

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def _main(pod: Any) -> Any:
    return pod.status.container_statuses[0]


def _one_pod(kube_cluster: Cluster, namespace: str = "default") -> Any:
    pods = kube_cluster.pods(namespace)
    return pods[0] if pods else None


def test_it_reports_oom_killed_for_exit_137_with_the_oom_flag(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("hungry", [rjob("main", script="pull=0s;run=2s;exit=137;oom")])
    pod = kube_cluster.eventually(lambda: (p := _one_pod(kube_cluster)) and p.status.phase == "Failed" and p, what="pod failed")
    term = _main(pod).state.terminated
    assert (term.exit_code, term.reason) == (137, "OOMKilled")
    kube_cluster.create_jobset("plain", [rjob("main", script="pull=0s;run=2s;exit=137")])
    pod = kube_cluster.eventually(lambda: [p for p in kube_cluster.pods(selector="jobset.sigs.k8s.io/jobset-name=plain")
                                      if p.status.phase == "Failed"], what="plain failed")[0]
    assert _main(pod).state.terminated.reason == "Error"


def test_it_reports_container_creation_errors(kube_cluster: Cluster) -> None:
    for name, script, reason in (("cfg", "pull=0s;create=fail:CreateContainerConfigError", "CreateContainerConfigError"),
                                 ("ctr", "pull=0s;create=fail:CreateContainerError", "CreateContainerError")):
        kube_cluster.create_jobset(name, [rjob("main", script=script)])
        pod = kube_cluster.eventually(lambda: [p for p in kube_cluster.pods(selector=f"jobset.sigs.k8s.io/jobset-name={name}")
                                          if p.status.container_statuses and _main(p).state.waiting
                                          and _main(p).state.waiting.reason == reason], what=reason)[0]
        assert pod.status.phase == "Pending" and _main(pod).state.waiting.message
        out = kube_cluster.kubectl("get", "pod", pod.metadata.name).stdout
        assert reason in out
        assert any(e.reason == "Failed" and e.type == "Warning" for e in kube_cluster.events("Pod", pod.metadata.name))


def test_it_reports_run_container_error_then_crash_loop(kube_cluster: Cluster) -> None:
    reasons: set[str] = set()
    kube_cluster.handle.store.add_listener(lambda event, rt, obj: reasons.update(
        (cs.get("state") or {}).get("waiting", {}).get("reason") or "" for cs in (obj.get("status") or {}).get("containerStatuses") or [])
        if rt.plural == "pods" else None)
    kube_cluster.create_jobset("nobin", [rjob("main", script="pull=0s;start=fail", restart_policy="OnFailure", backoff_limit=10)])
    pod = kube_cluster.eventually(lambda: (p := _one_pod(kube_cluster)) and p.status.container_statuses
                             and _main(p).state.waiting and _main(p).state.waiting.reason in ("RunContainerError", "CrashLoopBackOff")
                             and p, what="RunContainerError")
    last = _main(pod).last_state.terminated
    assert (last.exit_code, last.reason) == (128, "StartError")
    kube_cluster.eventually(lambda: {"RunContainerError", "CrashLoopBackOff"} <= reasons, what="both waiting reasons")
    kube_cluster.eventually(lambda: _main(_one_pod(kube_cluster)).restart_count >= 2, what="restarts counted")


def test_it_evicts_a_pod_under_node_pressure(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("pressed", [rjob("main", script="pull=0s;run=forever;evict=after:3s")])
    pod = kube_cluster.eventually(lambda: (p := _one_pod(kube_cluster)) and p.status.phase == "Failed" and p, what="evicted")
    assert pod.status.reason == "Evicted" and "low on resource" in pod.status.message
    cond = next(c for c in pod.status.conditions if c.type == "DisruptionTarget")
    assert (cond.status, cond.reason) == ("True", "TerminationByKubelet")
    job = kube_cluster.eventually(lambda: (j := kube_cluster.job("pressed-main-0")) and j.status.failed == 1 and j, what="counted")
    assert any(c.type == "Failed" for c in job.status.conditions or [])


def test_it_loses_a_node_and_keeps_the_pod_terminating_until_force_deleted(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("stranded", [rjob("main", script="pull=0s;run=forever;node=lost:3s")])
    pod = kube_cluster.eventually(lambda: (p := _one_pod(kube_cluster)) and p.metadata.deletion_timestamp and p, what="deleted by taint manager")
    cond = next(c for c in pod.status.conditions if c.type == "DisruptionTarget")
    assert (cond.status, cond.reason, cond.message) == ("True", "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
    # The deleted pod counts as failed at once; the Job waits for it to be gone before Failed.
    job = kube_cluster.eventually(lambda: (j := kube_cluster.job("stranded-main-0")) and any(c.type == "FailureTarget" for c in j.status.conditions or [])
                             and j, what="FailureTarget")
    assert job.status.failed == 1 and not any(c.type == "Failed" for c in job.status.conditions)
    # Well past the 30 s grace period (0.3 s wall at speed 100) it is still there.
    kube_cluster.eventually(lambda: kube_cluster.handle.clock.now() > pod.metadata.deletion_timestamp.timestamp() + 60, what="time passes")
    assert kube_cluster.core.read_namespaced_pod(pod.metadata.name, "default").metadata.deletion_timestamp
    assert "Terminating" in kube_cluster.kubectl("get", "pod", pod.metadata.name).stdout
    kube_cluster.kubectl("delete", "pod", pod.metadata.name, "--force", "--grace-period=0")
    kube_cluster.eventually(lambda: any(c.type == "Failed" for c in kube_cluster.job("stranded-main-0").status.conditions or []), what="Failed")
