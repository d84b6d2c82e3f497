"""Fixtures for the simulated controllers: an in-process Store + controllers on a fast clock.

No HTTP: tests act on `simulators.cluster.store.Store` exactly as a client would
and poll with `Sim.eventually` (bounded, never a fixed long sleep).
"""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from simulators.cluster.clock import SimClock
from simulators.cluster.controllers import Controllers, start_controllers
from simulators.cluster.store import Store
from tests import waiting
from tests.simulators.fixtures import queues_config
from tests.simulators.fixtures import rjob as rjob  # the one builder, re-exported for the tests here

SPEED = 100.0


class Sim:
    """A running simulator without the HTTP layer, plus story-friendly helpers."""

    def __init__(self, store: Store, clock: SimClock, ctrls: Controllers) -> None:
        self.store = store
        self.clock = clock
        self.ctrls = ctrls

    # --- reading -------------------------------------------------------------------
    def get(self, plural: str, name: str, namespace: str | None = "default") -> Any:
        try:
            return self.store.get(plural, namespace, name)
        except Exception as exc:
            if getattr(exc, "code", None) == 404:
                return None
            raise

    def list(self, plural: str, namespace: str | None = "default", label_selector: str | None = None) -> builtins.list[Any]:
        items: builtins.list[Any] = self.store.list(plural, namespace, label_selector=label_selector)[0]
        return items

    def jobset(self, name: str, namespace: str = "default") -> Any:
        obj = self.get("jobsets", name, namespace)
        assert obj is not None, f"jobset {name} is gone"
        return obj

    def counters(self, name: str, namespace: str = "default") -> dict[str, dict[str, int]]:
        st = self.jobset(name, namespace).get("status") or {}
        return {r["name"]: r for r in st.get("replicatedJobsStatus") or []}

    def condition(self, obj: dict[str, Any] | None, ctype: str) -> Any:
        for c in ((obj or {}).get("status") or {}).get("conditions") or []:
            if c["type"] == ctype:
                return c
        return None

    def workload_of(self, jobset_name: str, namespace: str = "default") -> Any:
        js = self.get("jobsets", jobset_name, namespace)
        if js is None:
            return None
        for wl in self.list("workloads", namespace):
            if any(r.get("uid") == js["metadata"]["uid"] for r in wl["metadata"].get("ownerReferences") or ()):
                return wl
        return None

    def events(self, kind: str, name: str, namespace: str = "default") -> builtins.list[Any]:
        return [e for e in self.list("events", namespace)
                if e["involvedObject"]["kind"] == kind and e["involvedObject"]["name"] == name]

    def reasons(self, kind: str, name: str, namespace: str = "default") -> set[str]:
        return {e["reason"] for e in self.events(kind, name, namespace)}

    # --- waiting -------------------------------------------------------------------
    def eventually(self, predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
        """Poll `predicate` (wall seconds) until it returns something truthy; an object not there yet
        (an assertion, a missing key or field) counts as "not yet"."""
        return waiting.eventually(predicate, timeout, what, interval=0.01,
                                  retry_on=(AssertionError, KeyError, TypeError))

    def settle(self, timeout: float = 5.0) -> None:
        assert self.ctrls.wait_idle(timeout), "controllers did not go idle"

    # --- writing ---------------------------------------------------------------------
    def create_jobset(self, name: str, replicated_jobs: builtins.list[dict[str, Any]], *, namespace: str = "default",
                      queue: str | None = "cpu-queue", labels: dict[str, str] | None = None,
                      **spec: Any) -> Any:
        md: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        if queue:
            md["labels"]["kueue.x-k8s.io/queue-name"] = queue
        body = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": md,
                "spec": {"replicatedJobs": replicated_jobs, **spec}}
        return self.store.create("jobsets", namespace, body)

    def patch_jobset(self, name: str, body: dict[str, Any], namespace: str = "default") -> Any:
        return self.store.patch("jobsets", namespace, name, "merge", body)


def _start(tmp_path: Path, overrides: dict[str, Any] | None) -> Sim:
    config_path = queues_config(tmp_path, **overrides) if overrides else None
    clock = SimClock(speed=SPEED)
    store = Store(clock=clock.now)
    ctrls = start_controllers(store, clock, str(config_path) if config_path else None)
    return Sim(store, clock, ctrls)


@pytest.fixture
def make_sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    """Factory: `make_sim(clusterQueues=[...])` starts a simulator with config overrides."""
    started: list[Sim] = []

    def make(**overrides: Any) -> Sim:
        sim = _start(tmp_path, overrides or None)
        started.append(sim)
        return sim

    yield make
    for sim in started:
        sim.ctrls.stop()
        sim.clock.stop()


@pytest.fixture
def sim(make_sim: Callable[..., Sim]) -> Sim:
    return make_sim()


def small_cluster_queue(cpu: str, **extra: Any) -> list[dict[str, Any]]:
    """A ClusterQueue with `cpu` nominal quota and LowerPriority preemption."""
    cq = {
        "name": "cluster-queue",
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
            {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                     {"name": "memory", "nominalQuota": "64Gi"}]}]}],
    }
    cq.update(extra)
    return [cq]
