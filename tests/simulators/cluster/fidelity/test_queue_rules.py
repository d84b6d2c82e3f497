"""Queue details as upstream Kueue: order after a PodsReadyTimeout eviction by the eviction time
(requeuingStrategy.timestamp Eviction, the default), queue-name label rules on update."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from kubernetes import client

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob

ONE_CPU = [{"name": "cluster-queue", "preemption": {"withinClusterQueue": "Never"}, "resourceGroups": [
    {"coveredResources": ["cpu"], "flavors": [{"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "1"}]}]}]}]


def _owners(kube_cluster: Cluster) -> list[str]:
    body: Any = kube_cluster.api.call_api("/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/cluster-queue/pendingworkloads", "GET",
                                     response_type=object, _return_http_data_only=True, auth_settings=[])
    return [i["metadata"]["ownerReferences"][0]["name"] for i in body["items"]]


def test_it_queues_a_pods_ready_timeout_victim_by_its_eviction_time(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=ONE_CPU, kueue={"waitForPodsReady": {
        "enable": True, "timeout": "60s", "requeuingStrategy": {"backoffBaseSeconds": 30}}})
    kube_cluster.create_jobset("stuck", [rjob("main", script="pull=fail:ImagePullBackOff")])
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("stuck"), "Admitted")["status"] == "True", what="stuck admitted")
    kube_cluster.create_jobset("next", [rjob("main", script="pull=0s;run=forever")])
    kube_cluster.create_jobset("later", [rjob("main", script="pull=0s;run=forever")])
    kube_cluster.eventually(lambda: _owners(kube_cluster) == ["next", "later"], what="two pending")
    # stuck times out; next takes the quota; after its back-off stuck queues behind later
    # (created before the eviction), not before it (created earlier).
    kube_cluster.eventually(lambda: _owners(kube_cluster) == ["later", "stuck"], timeout=30, what="later before stuck")


def test_it_keeps_the_queue_name_while_running_and_in_a_namespace_with_a_default_queue(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("named", [rjob("main", script="pull=0s;run=forever")])
    kube_cluster.eventually(lambda: kube_cluster.jobset("named")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")
    with pytest.raises(client.ApiException) as err:
        kube_cluster.custom.patch_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "named",
                                                      {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}}})
    assert err.value.status == 422 and "field is immutable" in str(err.value.body)
    # Suspending in the same update makes the change allowed (checked on the new object).
    kube_cluster.custom.patch_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "named",
                                                  {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}},
                                                   "spec": {"suspend": True}})
    with pytest.raises(client.ApiException) as err:
        kube_cluster.custom.patch_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "named",
                                                      {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": None}}})
    assert err.value.status == 422 and "queue-name must not be empty in namespace with default queue" in str(err.value.body)
