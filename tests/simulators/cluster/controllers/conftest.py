"""Helpers for the simulated controllers' stories, on ``sim``: the in-process Store + controllers
on a fast clock (tests/fixtures/simulators.py).

No HTTP: tests act on `simulators.cluster.store.Store` exactly as a client would
and poll with `Sim.eventually` (bounded, never a fixed long sleep).
"""

from __future__ import annotations

from typing import Any

from tests.fixtures.simulators import Sim as Sim  # the in-process simulator (``sim``), re-exported for the tests here
from tests.fixtures.simulators import rjob as rjob  # the one builder, re-exported for the tests here


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
