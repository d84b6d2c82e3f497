"""Queue configuration of the simulator: load the YAML file and seed the store.

`load_config` reads a file such as simulators/cluster/queues_default.yaml (format
in docs/architecture/simulator_controllers.md) into `SimConfig`; `seed`
creates the namespaces, ResourceFlavors, ClusterQueues and LocalQueues it
names (create-if-missing, never overwriting).  Called by
`simulators.cluster.controllers.start_controllers`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simulators.cluster.controllers.kueue import KueueOptions
from simulators.cluster.controllers.script import parse_duration
from simulators.cluster.resources import by_plural
from simulators.cluster.controllers.runtime import (
    CLUSTERQUEUES,
    LOCALQUEUES,
    NAMESPACES,
    RESOURCEFLAVORS,
    api_code,
)

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "queues_default.yaml"


@dataclass
class SimConfig:
    namespaces: list[str] = field(default_factory=lambda: ["default"])
    objects: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # (ResourceType, manifest)
    kueue: KueueOptions = field(default_factory=KueueOptions)
    nodes: list[str] = field(default_factory=lambda: ["sim-node-1"])
    jobset_feature_gates: dict[str, bool] = field(default_factory=dict)  # `jobset: {featureGates: {RestartJob: true}}`


def _split(item: dict[str, Any], namespaced: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    item = dict(item)
    md: dict[str, Any] = {"name": item.pop("name")}
    if namespaced:
        md["namespace"] = item.pop("namespace", "default")
    for k in ("labels", "annotations"):
        if k in item:
            md[k] = item.pop(k)
    return md, item


def _seconds(value: Any) -> float:
    """Seconds from a number or a duration string ("5m", "300s")."""
    if isinstance(value, (int, float)):
        return float(value)
    return parse_duration(str(value))


def parse_config(data: dict[str, Any] | None) -> SimConfig:
    data = data or {}
    cfg = SimConfig()
    cfg.namespaces = list(data.get("namespaces") or ["default"])
    for item in data.get("resourceFlavors") or []:
        md, spec = _split(item)
        cfg.objects.append((RESOURCEFLAVORS, {"apiVersion": RESOURCEFLAVORS.api_version, "kind": "ResourceFlavor",
                                              "metadata": md, "spec": spec}))
    for item in data.get("admissionChecks") or []:
        md, spec = _split(item)
        spec.setdefault("controllerName", "sim.xmc.dev/manual")
        cfg.objects.append((by_plural("admissionchecks"), {"apiVersion": by_plural("admissionchecks").api_version,
                                                          "kind": "AdmissionCheck", "metadata": md, "spec": spec}))
    for item in data.get("clusterQueues") or []:
        md, spec = _split(item)
        if "cohort" in spec:  # the v1beta1 name (config files predate v1beta2)
            spec["cohortName"] = spec.pop("cohort")
        spec.setdefault("namespaceSelector", {})
        spec.setdefault("queueingStrategy", "BestEffortFIFO")
        spec.setdefault("stopPolicy", "None")
        spec.setdefault("flavorFungibility", {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"})
        spec.setdefault("preemption", {"withinClusterQueue": "Never", "reclaimWithinCohort": "Never",
                                       "borrowWithinCohort": {"policy": "Never"}})
        cfg.objects.append((CLUSTERQUEUES, {"apiVersion": CLUSTERQUEUES.api_version, "kind": "ClusterQueue",
                                            "metadata": md, "spec": spec}))
    for item in data.get("localQueues") or []:
        md, spec = _split(item, namespaced=True)
        spec.setdefault("stopPolicy", "None")
        if md["namespace"] not in cfg.namespaces:
            cfg.namespaces.append(md["namespace"])
        cfg.objects.append((LOCALQUEUES, {"apiVersion": LOCALQUEUES.api_version, "kind": "LocalQueue",
                                          "metadata": md, "spec": spec}))
    k = data.get("kueue") or {}
    wfpr = k.get("waitForPodsReady") or {}
    backoff = wfpr.get("requeuingStrategy") or {}
    limit = backoff.get("backoffLimitCount")
    cfg.kueue = KueueOptions(
        # Kueue >= 0.19 enables waitForPodsReady by default (kueue apis/config/v1beta2/defaults.go).
        wait_for_pods_ready=bool(wfpr.get("enable", True)),
        pods_ready_timeout=_seconds(wfpr.get("timeout", 1800)),
        pods_ready_recovery_timeout=None if wfpr.get("recoveryTimeout") is None else _seconds(wfpr["recoveryTimeout"]),
        requeuing_backoff_base=_seconds(backoff.get("backoffBaseSeconds", 60)),
        requeuing_backoff_max=_seconds(backoff.get("backoffMaxSeconds", 3600)),
        requeuing_backoff_limit=None if limit is None else int(limit),
        granular_reasons=bool(k.get("granularReasons", True)),
        manage_jobs_without_queue_name=bool(k.get("manageJobsWithoutQueueName", False)),
        priority_classes={str(n): int(v) for n, v in (data.get("priorityClasses") or {}).items()},
        workload_priority_classes={str(n): int(v) for n, v in (data.get("workloadPriorityClasses") or {}).items()},
        default_priority_class=k.get("defaultPriorityClass"),
    )
    cfg.jobset_feature_gates = {str(k): bool(v) for k, v in ((data.get("jobset") or {}).get("featureGates") or {}).items()}
    nodes = (data.get("kubelet") or {}).get("nodes", 1)
    cfg.nodes = list(nodes) if isinstance(nodes, list) else [f"sim-node-{i + 1}" for i in range(max(1, int(nodes)))]
    return cfg


def load_config(path: str | Path | None = None) -> SimConfig:
    with open(path or DEFAULT_CONFIG, encoding="utf-8") as fh:
        return parse_config(yaml.safe_load(fh))


def seed(store: Any, cfg: SimConfig) -> None:
    """Create every configured object that does not exist yet."""
    todo: list[tuple[Any, dict[str, Any]]] = [(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
                                               for ns in cfg.namespaces]
    todo += cfg.objects
    for rt, obj in todo:
        try:
            store.create(rt, obj["metadata"].get("namespace"), obj)
        except Exception as exc:
            if api_code(exc) != 409:
                raise
