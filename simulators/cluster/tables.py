"""Server-side printing (meta.k8s.io/v1 Table) for `kubectl get`.

`simulators.cluster.apiserver` calls `to_table` when a GET or watch asks for
``application/json;as=Table;v=v1;g=meta.k8s.io``.  Columns reproduce the real
printers: the CRD additionalPrinterColumns of JobSet and the Kueue kinds, and
the built-in printers of pods, jobs, namespaces, events and leases (kubectl
shows priority-1 columns only with ``-o wide``).  Ages are rendered like
apimachinery's ``duration.HumanDuration`` against the simulator clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulators.cluster.resources import ResourceType
from simulators.cluster.store import parse_time

Obj = dict[str, Any]
Cell = Callable[[Obj, float], Any]


def human_duration(seconds: float) -> str:
    """apimachinery duration.HumanDuration."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 120:
        return f"{secs}s"
    minutes = secs // 60
    if minutes < 10:
        s = secs % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = secs // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def _age_of(ts: str | None, now: float) -> str:
    if not ts:
        return "<unknown>"
    try:
        return human_duration(now - parse_time(ts))
    except ValueError:
        return "<unknown>"


def _age(obj: Obj, now: float) -> str:
    return _age_of(obj.get("metadata", {}).get("creationTimestamp"), now)


def _path(*segments: str) -> Cell:
    def cell(obj: Obj, now: float) -> Any:
        cur: Any = obj
        for seg in segments:
            if not isinstance(cur, dict):
                return None
            cur = cur.get(seg)
        return cur

    return cell


def _condition_status(ctype: str) -> Cell:
    def cell(obj: Obj, now: float) -> Any:
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if isinstance(cond, dict) and cond.get("type") == ctype:
                return cond.get("status")
        return None

    return cell


def _name(obj: Obj, now: float) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


# -- pods (pkg/printers/internalversion printPod, abridged) -------------------


def _pod_status(pod: Obj) -> str:
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    init_statuses = status.get("initContainerStatuses") or []
    initializing = False
    n_init = len(spec.get("initContainers") or [])
    for i, cs in enumerate(init_statuses):
        state = cs.get("state") or {}
        term, wait = state.get("terminated"), state.get("waiting")
        if term and term.get("exitCode") == 0:
            continue
        if cs.get("started") and (spec.get("initContainers") or [{}] * (i + 1))[i].get("restartPolicy") == "Always":
            continue  # native sidecar
        if term:
            if term.get("reason"):
                reason = f"Init:{term['reason']}"
            elif term.get("signal"):
                reason = f"Init:Signal:{term['signal']}"
            else:
                reason = f"Init:ExitCode:{term.get('exitCode')}"
        elif wait and wait.get("reason") and wait["reason"] != "PodInitializing":
            reason = f"Init:{wait['reason']}"
        else:
            reason = f"Init:{i}/{n_init}"
        initializing = True
        break
    if not initializing:
        has_running = False
        for cs in reversed(status.get("containerStatuses") or []):
            state = cs.get("state") or {}
            wait, term = state.get("waiting"), state.get("terminated")
            if wait and wait.get("reason"):
                reason = wait["reason"]
            elif term and term.get("reason"):
                reason = term["reason"]
            elif term:
                reason = f"Signal:{term['signal']}" if term.get("signal") else f"ExitCode:{term.get('exitCode')}"
            elif state.get("running") and cs.get("ready"):
                has_running = True
        if reason == "Completed" and has_running:
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            reason = "Running" if ready else "NotReady"
    if pod.get("metadata", {}).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return str(reason)


def _pod_ready(pod: Obj, now: float) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for cs in statuses if cs.get("ready"))
    return f"{ready}/{total}"


def _pod_restarts(pod: Obj, now: float) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    restarts = sum(int(cs.get("restartCount") or 0) for cs in statuses)
    last: float | None = None
    for cs in statuses:
        finished = ((cs.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        if finished:
            try:
                ts = parse_time(finished)
            except ValueError:
                continue
            last = ts if last is None else max(last, ts)
    if restarts and last is not None:
        return f"{restarts} ({human_duration(now - last)} ago)"
    return str(restarts)


def _pod_ip(pod: Obj, now: float) -> str:
    return (pod.get("status") or {}).get("podIP") or "<none>"


def _pod_node(pod: Obj, now: float) -> str:
    return (pod.get("spec") or {}).get("nodeName") or "<none>"


def _pod_nominated(pod: Obj, now: float) -> str:
    return (pod.get("status") or {}).get("nominatedNodeName") or "<none>"


def _pod_gates(pod: Obj, now: float) -> str:
    gates = (pod.get("spec") or {}).get("readinessGates") or []
    if not gates:
        return "<none>"
    conds = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
    ok = sum(1 for g in gates if conds.get(g.get("conditionType")) == "True")
    return f"{ok}/{len(gates)}"


# -- jobs ---------------------------------------------------------------------


def _job_status(job: Obj, now: float) -> str:
    conds = {c.get("type"): c.get("status") for c in (job.get("status") or {}).get("conditions") or []}
    if conds.get("Complete") == "True":
        return "Complete"
    if conds.get("Failed") == "True":
        return "Failed"
    if job.get("metadata", {}).get("deletionTimestamp"):
        return "Terminating"
    if conds.get("FailureTarget") == "True":
        return "FailureTarget"
    if conds.get("SuccessCriteriaMet") == "True":
        return "SuccessCriteriaMet"
    if conds.get("Suspended") == "True":
        return "Suspended"
    return "Running"


def _job_completions(job: Obj, now: float) -> str:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    succeeded = int(status.get("succeeded") or 0)
    completions = spec.get("completions")
    if completions is not None:
        return f"{succeeded}/{completions}"
    parallelism = int(spec.get("parallelism") or 0)
    return f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"


def _job_duration(job: Obj, now: float) -> str:
    status = job.get("status") or {}
    start = status.get("startTime")
    if not start:
        return ""
    end = status.get("completionTime")
    try:
        return human_duration((parse_time(end) if end else now) - parse_time(start))
    except ValueError:
        return ""


def _job_containers(job: Obj, now: float) -> str:
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return ",".join(c.get("name", "") for c in spec.get("containers") or [])


def _job_images(job: Obj, now: float) -> str:
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return ",".join(c.get("image", "") for c in spec.get("containers") or [])


def _job_selector(job: Obj, now: float) -> str:
    labels = ((job.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


# -- events ---------------------------------------------------------------------


def _event_last_seen(ev: Obj, now: float) -> str:
    ts = ev.get("lastTimestamp") or ev.get("eventTime") or (ev.get("series") or {}).get("lastObservedTime")
    return _age_of(ts, now) if ts else "<unknown>"


def _event_first_seen(ev: Obj, now: float) -> str:
    ts = ev.get("firstTimestamp") or ev.get("eventTime")
    return _age_of(ts, now) if ts else "<unknown>"


def _event_object(ev: Obj, now: float) -> str:
    io = ev.get("involvedObject") or {}
    return f"{str(io.get('kind', '')).lower()}/{io.get('name', '')}"


def _event_source(ev: Obj, now: float) -> str:
    src = ev.get("source") or {}
    text = src.get("component") or ev.get("reportingComponent") or ""
    if src.get("host"):
        text = f"{text}, {src['host']}"
    return text


def _event_count(ev: Obj, now: float) -> int:
    return int(ev.get("count") or ((ev.get("series") or {}).get("count")) or 1)


def _event_message(ev: Obj, now: float) -> str:
    return str(ev.get("message") or "").strip()


# -- column sets ----------------------------------------------------------------

Column = tuple[str, str, str, int, Cell]  # name, type, format, priority, cell

_NAME_COL: Column = ("Name", "string", "name", 0, _name)
_AGE_COL: Column = ("Age", "date", "", 0, lambda o, now: _age(o, now))

COLUMNS: dict[str, list[Column]] = {
    "jobsets": [
        _NAME_COL,
        ("TerminalState", "string", "", 0, _path("status", "terminalState")),
        ("Restarts", "string", "", 0, _path("status", "restarts")),
        ("Completed", "string", "", 0, _condition_status("Completed")),
        ("Suspended", "string", "", 0, _path("spec", "suspend")),
        _AGE_COL,
    ],
    "workloads": [
        _NAME_COL,
        ("Queue", "string", "", 0, _path("spec", "queueName")),
        ("Reserved in", "string", "", 0, _path("status", "admission", "clusterQueue")),
        ("Admitted", "string", "", 0, _condition_status("Admitted")),
        ("Finished", "string", "", 0, _condition_status("Finished")),
        _AGE_COL,
    ],
    "clusterqueues": [
        _NAME_COL,
        ("Cohort", "string", "", 0, _path("spec", "cohortName")),
        ("Strategy", "string", "", 1, _path("spec", "queueingStrategy")),
        ("Pending Workloads", "integer", "", 0, _path("status", "pendingWorkloads")),
        ("Admitted Workloads", "integer", "", 1, _path("status", "admittedWorkloads")),
    ],
    "localqueues": [
        _NAME_COL,
        ("ClusterQueue", "string", "", 0, _path("spec", "clusterQueue")),
        ("Pending Workloads", "integer", "", 0, _path("status", "pendingWorkloads")),
        ("Admitted Workloads", "integer", "", 0, _path("status", "admittedWorkloads")),
    ],
    "resourceflavors": [_NAME_COL, _AGE_COL],
    "pods": [
        _NAME_COL,
        ("Ready", "string", "", 0, _pod_ready),
        ("Status", "string", "", 0, lambda o, now: _pod_status(o)),
        ("Restarts", "string", "", 0, _pod_restarts),
        _AGE_COL,
        ("IP", "string", "", 1, _pod_ip),
        ("Node", "string", "", 1, _pod_node),
        ("Nominated Node", "string", "", 1, _pod_nominated),
        ("Readiness Gates", "string", "", 1, _pod_gates),
    ],
    "jobs": [
        _NAME_COL,
        ("Status", "string", "", 0, _job_status),
        ("Completions", "string", "", 0, _job_completions),
        ("Duration", "string", "", 0, _job_duration),
        _AGE_COL,
        ("Containers", "string", "", 1, _job_containers),
        ("Images", "string", "", 1, _job_images),
        ("Selector", "string", "", 1, _job_selector),
    ],
    "namespaces": [
        _NAME_COL,
        ("Status", "string", "", 0, _path("status", "phase")),
        _AGE_COL,
    ],
    "events": [
        ("Last Seen", "string", "", 0, _event_last_seen),
        ("Type", "string", "", 0, _path("type")),
        ("Reason", "string", "", 0, _path("reason")),
        ("Object", "string", "", 0, _event_object),
        ("Message", "string", "", 0, _event_message),
        ("Subobject", "string", "", 1, lambda o, now: (o.get("involvedObject") or {}).get("fieldPath", "")),
        ("Source", "string", "", 1, _event_source),
        ("First Seen", "string", "", 1, _event_first_seen),
        ("Count", "integer", "", 1, _event_count),
        ("Name", "string", "name", 1, _name),
    ],
    "leases": [
        _NAME_COL,
        ("Holder", "string", "", 0, _path("spec", "holderIdentity")),
        _AGE_COL,
    ],
}

_DESCRIPTIONS = {
    "Name": "Name must be unique within a namespace. Cannot be updated.",
    "Age": "CreationTimestamp is a timestamp representing the server time when this object was created.",
}


def column_definitions(rt: ResourceType) -> list[dict[str, Any]]:
    return [
        {"name": name, "type": ctype, "format": fmt, "description": _DESCRIPTIONS.get(name, name), "priority": prio}
        for name, ctype, fmt, prio, _ in COLUMNS.get(rt.plural, [_NAME_COL, _AGE_COL])
    ]


def partial_metadata(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
            "labels", "annotations", "ownerReferences", "generation")
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {k: meta[k] for k in keep if k in meta},
    }


def row(rt: ResourceType, obj: Obj, now: float, include_object: str = "Metadata") -> dict[str, Any]:
    cols = COLUMNS.get(rt.plural, [_NAME_COL, _AGE_COL])
    cells = []
    for _, _, _, _, cell in cols:
        try:
            cells.append(cell(obj, now))
        except Exception:  # noqa: BLE001 - a malformed object must not break `kubectl get`
            cells.append(None)
    out: dict[str, Any] = {"cells": cells}
    if include_object == "Object":
        out["object"] = obj
    elif include_object != "None":
        out["object"] = partial_metadata(obj)
    return out


def to_table(rt: ResourceType, objs: list[Obj], now: float, resource_version: str = "",
             continue_token: str | None = None, include_headers: bool = True,
             include_object: str = "Metadata", remaining: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    table: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
    table["columnDefinitions"] = column_definitions(rt) if include_headers else None
    table["rows"] = [row(rt, o, now, include_object) for o in objs]
    return table
