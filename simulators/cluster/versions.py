"""API versions of the Kueue kinds: v1beta2 stored, v1beta1 served with conversion.

Kueue >= 0.16 stores `kueue.x-k8s.io/v1beta2` and still serves the deprecated
`v1beta1` through a conversion webhook (kueue apis/kueue/v1beta1/*_conversion.go,
apis/kueue/v1beta2/workload_types.go).  The simulator does the same for the
Kueue kinds of `simulators.cluster.resources.RESOURCE_TYPES`: objects are stored in
the storage version (`ResourceType.version`) and converted on the way in and
out when a request names another served version
(`simulators.cluster.resources.ResourceType.served_versions`).

Converted fields (v1beta2 <-> v1beta1; kueue apis/kueue/v1beta1/*_conversion.go):
Workload `spec.priorityClassRef{group, kind, name}` <-> `spec.priorityClassName`
+ `spec.priorityClassSource`, `status.accumulatedPastExecutionTimeSeconds` <->
`status.accumulatedPastExexcutionTimeSeconds` (the v1beta1 typo); ClusterQueue
`spec.cohortName` <-> `spec.cohort`; LocalQueue `status.flavorsUsage` <->
`status.flavorUsage`.  ResourceFlavor only changes `apiVersion`.
"""

from __future__ import annotations

import copy
from typing import Any

from simulators.cluster.resources import ResourceType

Obj = dict[str, Any]

_SOURCES = {
    "kueue.x-k8s.io/workloadpriorityclass": ("kueue.x-k8s.io", "WorkloadPriorityClass"),
    "scheduling.k8s.io/priorityclass": ("scheduling.k8s.io", "PriorityClass"),
}
_KINDS = {v: k for k, v in _SOURCES.items()}


def _workload_to_v1beta1(obj: Obj) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("priorityClassRef"), dict):
        ref = spec.pop("priorityClassRef")
        spec["priorityClassName"] = ref.get("name")
        source = _KINDS.get((ref.get("group") or "", ref.get("kind") or ""))
        if source:
            spec["priorityClassSource"] = source
    status = obj.get("status")
    if isinstance(status, dict) and "accumulatedPastExecutionTimeSeconds" in status:
        status["accumulatedPastExexcutionTimeSeconds"] = status.pop("accumulatedPastExecutionTimeSeconds")


def _workload_to_v1beta2(obj: Obj) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict) and ("priorityClassName" in spec or "priorityClassSource" in spec):
        name = spec.pop("priorityClassName", None)
        source = spec.pop("priorityClassSource", None)
        if name:
            group, kind = _SOURCES.get(source or "", _SOURCES["scheduling.k8s.io/priorityclass"])
            spec["priorityClassRef"] = {"group": group, "kind": kind, "name": name}
    status = obj.get("status")
    if isinstance(status, dict) and "accumulatedPastExexcutionTimeSeconds" in status:
        status["accumulatedPastExecutionTimeSeconds"] = status.pop("accumulatedPastExexcutionTimeSeconds")


_RENAMES: dict[str, list[tuple[str, str, str]]] = {  # kind -> [(section, v1beta2 name, v1beta1 name)]
    "ClusterQueue": [("spec", "cohortName", "cohort")],
    "LocalQueue": [("status", "flavorsUsage", "flavorUsage")],
}


def _rename(obj: Obj, kind: str, to_v1beta1: bool) -> None:
    for section, new, old in _RENAMES.get(kind, ()):
        part = obj.get(section)
        src, dst = (new, old) if to_v1beta1 else (old, new)
        if isinstance(part, dict) and src in part:
            part[dst] = part.pop(src)


def to_version(rt: ResourceType, obj: Any, version: str) -> Any:
    """A copy of the stored object `obj` as the client sees it in `version`."""
    if version == rt.version or not isinstance(obj, dict) or obj.get("kind") not in (rt.kind, None):
        return obj
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{rt.group}/{version}"
    if version == "v1beta1":
        if rt.kind == "Workload":
            _workload_to_v1beta1(out)
        _rename(out, rt.kind, to_v1beta1=True)
    return out


def from_version(rt: ResourceType, obj: Any, version: str) -> Any:
    """A copy of the client's object in `version` converted to the storage version."""
    if version == rt.version or not isinstance(obj, dict):
        return obj
    out = copy.deepcopy(obj)
    if "apiVersion" in out:
        out["apiVersion"] = rt.api_version
    if version == "v1beta1":
        if rt.kind == "Workload":
            _workload_to_v1beta2(out)
        _rename(out, rt.kind, to_v1beta1=False)
    return out
