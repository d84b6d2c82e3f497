"""Validation as upstream, so manifests that only work in the simulator are refused:
Indexed Jobs need completions (kubernetes pkg/apis/batch/validation), JobSet webhook rules
(jobset pkg/webhooks/jobset_webhook.go): RestartJob* actions behind the RestartJob gate,
failure-policy rules, the coordinator."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from kubernetes import client

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def _invalid(kube_cluster: Cluster, name: str, rjobs: list[dict[str, Any]], **spec: Any) -> str:
    with pytest.raises(client.ApiException) as err:
        kube_cluster.create_jobset(name, rjobs, **spec)
    assert err.value.status == 422
    return str(err.value.body)


def test_it_loops_job_creation_failed_for_an_indexed_job_without_completions(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("nocount", [rjob("main", pods=2, completions=None)])
    ev = kube_cluster.eventually(lambda: [e for e in kube_cluster.events("JobSet", "nocount") if e.reason == "JobCreationFailed"],
                            what="JobCreationFailed")[0]
    assert ev.type == "Warning" and "spec.completions" in ev.message and "Indexed" in ev.message
    assert kube_cluster.batch.list_namespaced_job("default").items == []
    # The Workload is created and admitted regardless; the Jobs still cannot be created.
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("nocount"), "Admitted")["status"] == "True", what="admitted")
    kube_cluster.eventually(lambda: sum(e.count or 1 for e in kube_cluster.events("JobSet", "nocount") if e.reason == "JobCreationFailed") >= 2,
                       what="creation retried")
    with pytest.raises(client.ApiException) as err:
        kube_cluster.batch.create_namespaced_job("default", {"metadata": {"name": "direct"}, "spec": {
            "completionMode": "Indexed", "parallelism": 2, "template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}})
    assert err.value.status == 422 and "spec.completions" in str(err.value.body)


def test_it_refuses_restart_job_actions_unless_the_gate_is_on(make_kube_cluster: Callable[..., Cluster]) -> None:
    policy = {"failurePolicy": {"maxRestarts": 1, "rules": [{"name": "one", "action": "RestartJob"}]}}
    off = make_kube_cluster()
    body = _invalid(off, "gated", [rjob("main")], **policy)
    assert "RestartJob feature gate is disabled" in body
    on = make_kube_cluster(jobset={"featureGates": {"RestartJob": True}})
    on.create_jobset("gated", [rjob("main")], **policy)
    assert "too many" in _invalid(on, "wide", [rjob("main", replicas=1025)], **policy).replace(
        "replicas > 1024", "too many")


def test_it_validates_failure_policy_rules_and_the_coordinator(kube_cluster: Cluster) -> None:
    body = _invalid(kube_cluster, "rules", [rjob("main")], failurePolicy={"rules": [
        {"name": "a", "action": "FailJobSet", "onJobFailureReasons": ["OOM"]},
        {"name": "a", "action": "Explode", "targetReplicatedJobs": ["nope"]}]})
    for needle in ("Duplicate value", "Unsupported value: \\\"Explode\\\"", "\\\"nope\\\"", "\\\"OOM\\\""):
        assert needle in body, needle
    body = _invalid(kube_cluster, "coord", [rjob("main", replicas=2)], coordinator={"replicatedJob": "main", "jobIndex": 2})
    assert "coordinator job index 2 is invalid" in body
    body = _invalid(kube_cluster, "coord2", [rjob("main")], coordinator={"replicatedJob": "other"})
    assert "coordinator replicatedJob other does not exist" in body
