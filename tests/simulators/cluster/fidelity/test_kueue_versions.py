"""Kueue API versions: v1beta2 is stored and preferred, v1beta1 is served with conversion;
Workload short names kwl / kueueworkload(s); the visibility API in v1beta2 and v1beta1."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client, watch

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def _raw_get(kube_cluster: Cluster, path: str) -> Any:
    data = kube_cluster.api.call_api(path, "GET", response_type=object, _return_http_data_only=True, auth_settings=[])
    return data


def test_it_prefers_v1beta2_and_serves_v1beta1_with_conversion(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("ranked", [rjob("main", script="run=forever")], labels={"kueue.x-k8s.io/priority-class": "high"})
    v2 = kube_cluster.eventually(lambda: kube_cluster.workload_of("ranked", version="v1beta2"), what="workload")
    assert v2["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert v2["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"}
    assert "priorityClassName" not in v2["spec"]
    v1 = kube_cluster.workload_of("ranked", version="v1beta1")
    assert v1["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert (v1["spec"]["priorityClassName"], v1["spec"]["priorityClassSource"]) == ("high", "kueue.x-k8s.io/workloadpriorityclass")
    assert "priorityClassRef" not in v1["spec"]
    assert v1["metadata"]["uid"] == v2["metadata"]["uid"]

    group = client.ApisApi(kube_cluster.api).get_api_versions()
    kueue = next(g for g in group.groups if g.name == "kueue.x-k8s.io")
    assert kueue.preferred_version.version == "v1beta2"
    assert [v.version for v in kueue.versions] == ["v1beta2", "v1beta1"]


def test_it_patches_and_watches_through_v1beta1(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("old-client", [rjob("main", script="run=forever")])
    name = kube_cluster.eventually(lambda: kube_cluster.workload_of("old-client"), what="workload")["metadata"]["name"]
    out = kube_cluster.custom.patch_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "workloads", name,
                                                       {"spec": {"active": False}})
    assert out["apiVersion"] == "kueue.x-k8s.io/v1beta1" and out["spec"]["active"] is False
    stored = kube_cluster.custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "default", "workloads", name)
    assert stored["spec"]["active"] is False and "priorityClassSource" not in stored["spec"]
    w = watch.Watch()
    first = next(iter(w.stream(kube_cluster.custom.list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta1", "default",
                               "workloads", timeout_seconds=5)))
    w.stop()
    assert first["object"]["apiVersion"] == "kueue.x-k8s.io/v1beta1"


def test_it_knows_the_workload_short_names(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("short", [rjob("main", script="run=forever")])
    name = kube_cluster.eventually(lambda: kube_cluster.workload_of("short"), what="workload")["metadata"]["name"]
    for alias in ("kwl", "kueueworkload", "kueueworkloads", "workloads.v1beta1.kueue.x-k8s.io"):
        out = kube_cluster.kubectl("get", alias, "-o", "name").stdout
        assert f"{name}" in out, (alias, out)
    as_json = json.loads(kube_cluster.kubectl("get", "kwl", name, "-o", "json").stdout)
    assert as_json["apiVersion"] == "kueue.x-k8s.io/v1beta2"


def test_it_serves_the_visibility_api_in_v1beta2_and_v1beta1(make_kube_cluster: Any) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=[{"name": "cluster-queue", "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "1"}]}]}]}])
    kube_cluster.create_jobset("first", [rjob("main", script="run=forever")])
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("first"), "Admitted")["status"] == "True", what="first admitted")
    kube_cluster.create_jobset("second", [rjob("main", script="run=forever")])
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("second"), "QuotaReserved"), what="second pending")
    for version in ("v1beta2", "v1beta1"):
        body = _raw_get(kube_cluster, f"/apis/visibility.kueue.x-k8s.io/{version}/clusterqueues/cluster-queue/pendingworkloads")
        assert body["apiVersion"] == f"visibility.kueue.x-k8s.io/{version}"
        assert [i["metadata"]["ownerReferences"][0]["name"] for i in body["items"]] == ["second"]
        lq = _raw_get(kube_cluster, f"/apis/visibility.kueue.x-k8s.io/{version}/namespaces/default/localqueues/cpu-queue/pendingworkloads")
        assert lq["items"][0]["positionInLocalQueue"] == 0


def test_it_converts_queue_field_renames(make_kube_cluster: Any) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=[{"name": "cluster-queue", "cohort": "team", "resourceGroups": [
        {"coveredResources": ["cpu"], "flavors": [{"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}])
    v2 = kube_cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", "cluster-queue")
    v1 = kube_cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", "cluster-queue")
    assert (v2["spec"].get("cohortName"), v1["spec"].get("cohort")) == ("team", "team")
    assert "cohort" not in v2["spec"] and "cohortName" not in v1["spec"]
    lq2 = kube_cluster.eventually(lambda: (q := kube_cluster.custom.get_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", "default", "localqueues", "cpu-queue")).get("status") and q, what="LocalQueue status")
    lq1 = kube_cluster.custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "localqueues", "cpu-queue")
    assert "flavorsUsage" in lq2["status"] and "flavorUsage" not in lq2["status"]
    assert lq1["status"]["flavorUsage"] == lq2["status"]["flavorsUsage"]
