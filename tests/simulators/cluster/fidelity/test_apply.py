"""`kubectl apply` of the same JobSet manifest twice is a no-op, as on a real API server
(the JobSet defaulting webhook runs on UPDATE before the immutability check)."""

from __future__ import annotations

from typing import Callable

from tests.simulators.cluster.fidelity.conftest import Cluster

MANIFEST = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: {name}
  labels:
    kueue.x-k8s.io/queue-name: {queue}
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 1
        completions: 1
        backoffLimit: 0
        template:
          metadata:
            annotations:
              sim.xmc.dev/script: "run=forever"
          spec:
            containers:
            - name: main
              image: busybox:1.36
              resources:
                requests:
                  cpu: "{cpu}"
"""


def test_it_applies_the_same_manifest_twice_on_a_pending_jobset(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(clusterQueues=[{"name": "cluster-queue", "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "1"}]}]}]}])
    manifest = MANIFEST.format(name="twice", queue="cpu-queue", cpu="1")
    assert "created" in kube_cluster.kubectl("apply", "-f", "-", input=manifest).stdout
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("twice"), "QuotaReserved"), what="pending verdict")
    before = kube_cluster.jobset("twice")["metadata"]["resourceVersion"]
    out = kube_cluster.kubectl("apply", "-f", "-", input=manifest).stdout
    assert "unchanged" in out or "configured" in out
    js = kube_cluster.jobset("twice")
    assert js["metadata"]["resourceVersion"] == before
    assert js["spec"]["suspend"] is True


def test_it_applies_the_same_manifest_twice_on_an_unmanaged_running_jobset(kube_cluster: Cluster) -> None:
    kube_cluster.core.create_namespace({"metadata": {"name": "plain"}})
    manifest = MANIFEST.format(name="again", queue="", cpu="1").replace("    kueue.x-k8s.io/queue-name: \n", "    team: a\n")
    kube_cluster.kubectl("apply", "-f", "-", input=manifest, namespace="plain")
    kube_cluster.eventually(lambda: kube_cluster.jobset("again", "plain")["status"]["replicatedJobsStatus"][0]["ready"] == 2, what="running")
    before = kube_cluster.jobset("again", "plain")["metadata"]["generation"]
    kube_cluster.kubectl("apply", "-f", "-", input=manifest, namespace="plain")
    assert kube_cluster.jobset("again", "plain")["metadata"]["generation"] == before
