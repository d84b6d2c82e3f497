"""`kube_cluster`: a whole simulator (API server + controllers) over HTTP, driven by the `kubernetes`
library's own client and `kubectl` (not the product's `k8s_bridge.client`: that is `cluster`,
tests/fixtures/simulators.py). Both serve the simulator through `start_simulator`.

Each test starts its own simulator on a free port at speed 100 (one simulated
minute is 0.6 wall seconds) with a queue config built from the default file
plus overrides, so Kueue settings such as short waitForPodsReady timeouts can
be set per test.  `Cluster.eventually` polls (bounded) instead of sleeping.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from simulators.cluster.server import SimulatorHandle
from tests import waiting
from tests.fixtures.simulators import rjob as rjob  # the one builder, re-exported for the tests here

SPEED = 100.0
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
KUEUE = "kueue.x-k8s.io"


class Cluster:
    """A running simulator plus typed clients and story helpers."""

    def __init__(self, handle: SimulatorHandle, api: client.ApiClient, kubectl_cache: Path) -> None:
        self.handle = handle
        self.api = api
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._kubectl_cache = kubectl_cache

    # --- objects ---------------------------------------------------------------------
    def create_jobset(self, name: str, replicated_jobs: list[dict[str, Any]], *, namespace: str = "default",
                      queue: str | None = "cpu-queue", labels: dict[str, str] | None = None, **spec: Any) -> Any:
        md: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if queue:
            md["labels"]["kueue.x-k8s.io/queue-name"] = queue
        body = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": md,
                "spec": {"replicatedJobs": replicated_jobs, **spec}}
        return self.custom.create_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], body)

    def jobset(self, name: str, namespace: str = "default") -> Any:
        return self.custom.get_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], name)

    def workloads(self, namespace: str = "default", version: str = "v1beta2") -> list[Any]:
        return list(self.custom.list_namespaced_custom_object(KUEUE, version, namespace, "workloads")["items"])

    def workload_of(self, jobset_name: str, namespace: str = "default", version: str = "v1beta2") -> Any:
        try:
            uid = self.jobset(jobset_name, namespace)["metadata"]["uid"]
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        for wl in self.workloads(namespace, version):
            if any(r.get("uid") == uid for r in wl["metadata"].get("ownerReferences") or ()):
                return wl
        return None

    def stop_policy(self, local_queue: str, policy: str, namespace: str = "default") -> Any:
        """Set a LocalQueue's ``stopPolicy`` (``Hold``: Kueue admits nothing new from it; ``None``: again)."""
        return self.custom.patch_namespaced_custom_object(
            KUEUE, "v1beta2", namespace, "localqueues", local_queue, {"spec": {"stopPolicy": policy}})

    def pods(self, namespace: str = "default", selector: str | None = None) -> list[Any]:
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector or "").items)

    def job(self, name: str, namespace: str = "default") -> Any:
        """The Job, or None while it does not exist (yet)."""
        try:
            return self.batch.read_namespaced_job(name, namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def events(self, kind: str, name: str, namespace: str = "default") -> list[Any]:
        return [e for e in self.core.list_namespaced_event(namespace).items
                if e.involved_object.kind == kind and e.involved_object.name == name]

    @staticmethod
    def cond(obj: Any, ctype: str) -> Any:
        for c in ((obj or {}).get("status") or {}).get("conditions") or []:
            if c["type"] == ctype:
                return c
        return None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                namespace: str | None = "default") -> subprocess.CompletedProcess[str]:
        cmd = ["kubectl", "--kubeconfig", str(self.handle.kubeconfig_path), "--cache-dir", str(self._kubectl_cache)]
        if namespace:
            cmd += ["-n", namespace]
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        proc = subprocess.run([*cmd, *args], input=input, capture_output=True, text=True, timeout=60, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    # --- waiting ---------------------------------------------------------------------
    @staticmethod
    def eventually(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
        return waiting.eventually(predicate, timeout, what, interval=0.02,
                                  retry_on=(AssertionError, KeyError, TypeError, IndexError))


@pytest.fixture
def make_kube_cluster(start_simulator: Callable[..., SimulatorHandle], tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Factory: `make_kube_cluster(kueue={...}, clusterQueues=[...])` starts a simulator with config overrides."""
    apis: list[client.ApiClient] = []

    def make(**overrides: Any) -> Cluster:
        handle = start_simulator(speed=SPEED, **overrides)
        api = client.ApiClient(client.Configuration(host=handle.url))
        apis.append(api)
        cache = tmp_path / f"kubectl-cache-{len(apis)}"
        cache.mkdir()
        return Cluster(handle, api, cache)

    yield make
    for api in apis:
        api.close()


@pytest.fixture
def kube_cluster(make_kube_cluster: Callable[..., Cluster]) -> Cluster:
    """A simulator with the default queue config (Kueue 0.19 defaults)."""
    return make_kube_cluster()
