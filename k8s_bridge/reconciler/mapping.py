"""What an observed JobSet (with its Workload and Pods) means for its execution.

Pure functions over the objects as the API server returns them (plain dicts):
no I/O, no clock reads (the caller passes ``now``). The reconciler
(``k8s_bridge.reconciler.controller``) calls :func:`observe` for every JobSet
whose inputs changed and turns the :class:`Observation` into masked
execution updates.

* :func:`to_work_unit_state` is the JobSet -> WorkUnitState table of
  STATES.md (Go: ToWorkUnitState), first match wins, in the corrected order:
  ``failed > 0`` and ``succeeded > 0`` come after the ready/active rules.
* :func:`scheduling_information` explains a SCHEDULING execution: queue and
  1-based position (Kueue visibility API), the ``QuotaReserved=False``
  message, and why it is pending *again* after an eviction.
* :func:`startup_diagnostic` and :func:`failure_explanation`
  (``k8s_bridge.reconciler.explain``) turn pod, Job and JobSet states into an
  ERROR system message; a Workload Kueue deactivated gets one too.
* :func:`execution_metadata` says where the execution really runs.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from core.keys import ExecutionKey
from jobsets import contract
from k8s_bridge.reconciler import explain
from workunits.choices import WorkUnitState

S = WorkUnitState
Obj = Mapping[str, Any]

# The JobSet contract (names, labels, annotation, finalizer) is spelled once, in jobsets.contract.
XID_LABEL = contract.LABEL_XID
WID_LABEL = contract.LABEL_WID
EID_LABEL = contract.LABEL_EID
QUEUE_LABEL = contract.QUEUE_LABEL
NOTIFY_WHEN_ANNOTATION = contract.ANNOTATION_NOTIFY_WHEN
FINALIZER = contract.FINALIZER
JOBSET_NAME_LABEL = contract.JOBSET_NAME_LABEL
#: Label selector of the JobSets this system created (the builder sets all three).
JOBSET_SELECTOR = contract.JOBSET_SELECTOR

#: Container waiting reasons that mean "this will not start by itself" (STATES.md, startup diagnostics).
STARTUP_FAILURE_REASONS = explain.STARTUP_FAILURE_REASONS
#: Pod-level reasons of a pod lost with its node (kubelet / node lifecycle / eviction).
NODE_LOSS_REASONS = explain.NODE_LOSS_REASONS

SCHEDULER = "SCHEDULER"
KUBERNETES = "KUBERNETES"


def execution_key(jobset: Obj) -> ExecutionKey | None:
    """(xid, wid, eid) from our labels; ``None`` for a JobSet that is not ours."""
    labels = (jobset.get("metadata") or {}).get("labels") or {}
    try:
        key = ExecutionKey(int(labels[XID_LABEL]), int(labels[WID_LABEL]), int(labels[EID_LABEL]))
    except (KeyError, TypeError, ValueError):
        return None
    if key.xid <= 0 or key.wid <= 0 or key.eid <= 0:
        return None
    return key


# --- Conditions and times ------------------------------------------------------------


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def find_condition(obj: Obj | None, kind: str) -> Mapping[str, Any] | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


def condition_true(obj: Obj | None, kind: str) -> bool:
    condition = find_condition(obj, kind)
    return condition is not None and condition.get("status") == "True"


# --- JobSet -> WorkUnitState -----------------------------------------------------------


@dataclass(frozen=True)
class JobSetTotals:
    replicas: int
    ready: int
    active: int
    succeeded: int
    failed: int


def jobset_totals(jobset: Obj) -> JobSetTotals:
    """Sum ``status.replicatedJobsStatus`` counters; replicas come from the spec."""
    spec = jobset.get("spec") or {}
    replicas = sum(int(rj.get("replicas", 1) or 0) for rj in spec.get("replicatedJobs") or [])
    counters = {"ready": 0, "active": 0, "succeeded": 0, "failed": 0}
    for rjs in (jobset.get("status") or {}).get("replicatedJobsStatus") or []:
        for key in counters:
            counters[key] += int(rjs.get(key, 0) or 0)
    return JobSetTotals(replicas=replicas, **counters)


def to_work_unit_state(jobset: Obj) -> str:
    """Map an observed JobSet to a WorkUnitState (first matching rule wins).

    The rule numbers are those of the table in STATES.md.
    """
    completed = condition_true(jobset, "Completed")
    failed = condition_true(jobset, "Failed")
    if (jobset.get("metadata") or {}).get("deletionTimestamp"):  # rule 1: finalizer path
        if completed:
            return S.COMPLETED
        if failed:
            return S.FAILED
        return S.STOPPED
    if completed:  # rule 2
        return S.COMPLETED
    if failed:  # rule 3
        return S.FAILED
    totals = jobset_totals(jobset)
    if totals.ready > 0 and totals.ready + totals.succeeded >= totals.replicas:  # rule 4
        return S.RUNNING
    if totals.active > 0:  # rule 5
        return S.STARTING
    if totals.failed > 0:  # rule 6 (Go 8a): nothing active, the failure policy has not acted yet
        return S.PARTIALLY_FAILED
    if totals.succeeded > 0:  # rule 7 (Go 8b): e.g. evicted after some jobs finished
        return S.RUNNING
    suspended = find_condition(jobset, "Suspended")
    if suspended is not None and suspended.get("status") == "False" and not (jobset.get("spec") or {}).get("suspend"):
        # rule 8a: admitted, nothing active yet -- its pods are being created, or a Job waits out the
        # back-off before it tries a failed pod again. The quota is held: not a queue (issue 39).
        return S.STARTING
    return S.SCHEDULING  # rule 8 (Go 9)


# --- detailed_status.jobset_status ----------------------------------------------------


def jobset_status(jobset: Obj) -> dict[str, Any]:
    """``ExecutableStatus`` (proto3 JSON) with the JobSet's counters, restarts and conditions."""
    status = jobset.get("status") or {}
    rjobs = sorted(status.get("replicatedJobsStatus") or [], key=lambda r: str(r.get("name", "")))
    conditions = []
    for c in status.get("conditions") or []:
        entry = {k: str(c[k]) for k in ("type", "status", "reason", "message") if c.get(k)}
        when = parse_time(c.get("lastTransitionTime"))
        if when is not None:
            entry["updateTime"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions.append(entry)
    out: dict[str, Any] = {
        "conditions": conditions,
        "replicatedJobsStatus": [
            {"name": str(r.get("name", "")), **{k: int(r.get(k, 0) or 0) for k in ("ready", "succeeded", "active", "failed")}}
            for r in rjobs
        ],
    }
    if int(status.get("restarts", 0) or 0):
        out["restarts"] = int(status["restarts"])
    return {"jobsetStatus": out}


# --- scheduling_information ------------------------------------------------------------


@dataclass(frozen=True)
class QueuePosition:
    """Where a pending Workload stands (Kueue visibility API; ``position`` is 1-based)."""

    position: int
    total: int


def _message(severity: str, source: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"severity": severity, "source": source, "userFacingText": text, **extra}


_PREEMPTOR = re.compile(r"\(UID: ([^,)]+)")


def preemptor_uid(message: str) -> str:
    """The preempting Workload's UID from Kueue's ``Preempted to accommodate a workload (UID: ...)``."""
    match = _PREEMPTOR.search(message or "")
    return match.group(1).strip() if match else ""


def _evicted_now(workload: Obj) -> Mapping[str, Any] | None:
    """The Evicted condition when it explains the current pending period (see pitfall 6.4).

    ``Evicted=True`` stays True after the requeue until the next admission
    flips it to False, so True means "pending because of this eviction".
    """
    evicted = find_condition(workload, "Evicted")
    if evicted is None or evicted.get("status") != "True":
        return None
    return evicted


def eviction_text(evicted: Mapping[str, Any], *, preemptor_priority: int | None, waiting_on: str) -> str:
    reason = str(evicted.get("reason") or "")
    message = str(evicted.get("message") or "")
    if reason == "Preempted":
        who = f" with priority {preemptor_priority}" if preemptor_priority is not None else ""
        return f"Evicted (Preempted) by a higher-priority workload{who}; waiting to be admitted again. ({message})"
    if reason == "PodsReadyTimeout":
        waited = f" Pods were waiting on: {waiting_on}." if waiting_on else ""
        return (f"Evicted (PodsReadyTimeout): its pods were not all ready within Kueue's waitForPodsReady"
                f" timeout; requeued with backoff.{waited} ({message})")
    if reason.startswith("Deactivated"):
        return f"Evicted ({reason}): the workload was deactivated; it will not be admitted until reactivated. ({message})"
    if reason in ("ClusterQueueStopped", "LocalQueueStopped"):
        return f"Evicted ({reason}): its queue was stopped; waiting for the queue to resume. ({message})"
    return f"Evicted ({reason}); waiting to be admitted again. ({message})"


def scheduling_information(
    jobset: Obj,
    workload: Obj | None,
    position: QueuePosition | None,
    *,
    preemptor_priority: int | None = None,
    waiting_on: str = "",
) -> dict[str, Any]:
    """A StructuredMessage saying why a SCHEDULING execution is not running yet."""
    queue = ((jobset.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL, "")
    if workload is not None:
        queue = (workload.get("spec") or {}).get("queueName") or queue
    parts = [f"Queued in {queue}" if queue else "Waiting to be scheduled"]
    if position is not None:
        parts[0] += f" (position {position.position} of {position.total})"
    reasons: list[str] = []
    if workload is None:
        reasons.append("waiting for Kueue to create the workload")
    else:
        evicted = _evicted_now(workload)
        if evicted is not None:
            reasons.append(eviction_text(evicted, preemptor_priority=preemptor_priority, waiting_on=waiting_on))
        quota = find_condition(workload, "QuotaReserved")
        if quota is not None and quota.get("status") == "False" and quota.get("message"):
            text = str(quota["message"])
            if evicted is None or text not in str(evicted.get("message") or ""):
                reasons.append(f"{quota.get('reason') or 'Pending'}: {text}")
        if condition_true(workload, "QuotaReserved") and evicted is None:
            reasons.append("admitted; starting")
    text = parts[0] + (": " + " ".join(reasons) if reasons else "")
    extra: dict[str, Any] = {}
    if position is not None:
        extra["auxiliaryInfo"] = {"queueInfo": {"positionInQueue": position.position,
                                                "totalWorkloadsInQueue": position.total}}
    return _message("INFO", SCHEDULER, text, **extra)


# --- pod diagnostics -------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerProblem:
    pod: str
    container: str
    image: str
    reason: str
    message: str

    def describe(self) -> str:
        detail = f": {self.message}" if self.message else ""
        return f"pod {self.pod} container {self.container} (image {self.image}) {self.reason}{detail}"


def waiting_problems(pods: Iterable[Obj]) -> list[ContainerProblem]:
    """Regular containers (init containers skipped) waiting for a reason that will not heal by itself."""
    found = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        name = str((pod.get("metadata") or {}).get("name", ""))
        images = {c.get("name"): c.get("image", "") for c in (pod.get("spec") or {}).get("containers") or []}
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            if reason in STARTUP_FAILURE_REASONS:
                image = str(images.get(cs.get("name")) or cs.get("image") or "")
                found.append(ContainerProblem(name, str(cs.get("name", "")), image, reason,
                                              str(waiting.get("message") or "")))
    return found


def waiting_summary(pods: Iterable[Obj]) -> str:
    """What not-ready pods wait on, for the PodsReadyTimeout explanation ("" when nothing useful)."""
    problems = waiting_problems(pods)
    if problems:
        return "; ".join(p.describe() for p in problems[:3])
    reasons: dict[str, int] = {}
    for pod in pods:
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
            if reason:
                reasons[str(reason)] = reasons.get(str(reason), 0) + 1
        scheduled = find_condition(pod, "PodScheduled")
        if scheduled is not None and scheduled.get("status") == "False":
            key = str(scheduled.get("reason") or "Unschedulable")
            reasons[key] = reasons.get(key, 0) + 1
    return ", ".join(f"{n} container(s) {r}" for r, n in sorted(reasons.items()))


def startup_diagnostic(jobset: Obj, pods: Sequence[Obj], *, now: datetime, grace: timedelta) -> dict[str, Any] | None:
    """An ERROR message when the JobSet was admitted ``grace`` ago and a container cannot start."""
    suspended = find_condition(jobset, "Suspended")
    if suspended is None or suspended.get("status") != "False":
        return None  # never admitted, or suspended again (evicted)
    anchor = parse_time(suspended.get("lastTransitionTime"))
    if anchor is None or now - anchor < grace:
        return None
    problems = waiting_problems(pods)
    if not problems:
        return None
    first = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return _message("ERROR", KUBERNETES, f"Cannot start: {first.describe()}{more}")


def failure_explanation(pods: Sequence[Obj], deleted: Sequence[Obj] = (), *, jobset: Obj | None = None,
                        jobs: Sequence[Obj] = (), tails: explain.Tails | None = None,
                        waited_on: str = "") -> dict[str, Any] | None:
    """Explain a failure (PARTIALLY_FAILED / FAILED): `k8s_bridge.reconciler.explain.failure_message`.

    ``deleted`` are pods that were deleted before they succeeded (the Job
    controller counts them as failed, reference §5.19); they are gone from
    the cluster by the time the JobSet fails, so the caller remembers them.
    ``jobs`` are the JobSet's Jobs (their failure reasons), ``tails`` the
    archived last log lines of its containers.
    """
    return explain.failure_message(jobset, pods, deleted, jobs, tails, waited_on)


# --- execution metadata -------------------------------------------------------------


def execution_metadata(jobset: Obj, workload: Obj | None, *, cluster_name: str = "") -> dict[str, Any]:
    """``WorkUnitExecutionMetadata`` fields (proto3 JSON) from the JobSet and its admission."""
    md = jobset.get("metadata") or {}
    out: dict[str, Any] = {"resourceName": str(md.get("name", "")), "namespace": str(md.get("namespace", ""))}
    if cluster_name:
        out["managementCluster"] = {"clusterName": cluster_name}
        out["executingCluster"] = {"clusterName": cluster_name}
    if workload is None:
        return out
    admission = (workload.get("status") or {}).get("admission") or {}
    flavors = sorted({str(f) for psa in admission.get("podSetAssignments") or []
                      for f in (psa.get("flavors") or {}).values()})
    if flavors:
        out["resourceFlavor"] = ",".join(flavors)
    selectors: dict[str, str] = {}
    if admission:
        for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
            pod_spec = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            selectors.update({str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()})
    if selectors:
        out["nodeSelectors"] = selectors
    remote = str((workload.get("status") or {}).get("clusterName") or "")
    if remote:
        out["multiKueueClusterName"] = remote
        out["executingCluster"] = {"clusterName": remote}
    return out


# --- everything at once -------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """What one look at a JobSet says about its execution."""

    key: ExecutionKey
    state: str
    detailed_status: dict[str, Any]
    scheduling_information: dict[str, Any] | None
    #: An ERROR diagnostic (startup failure, failure explanation, deactivation) or ``None``.
    system_message: dict[str, Any] | None
    metadata: dict[str, Any]
    #: the JobSet's resourceVersion this observation was computed from
    resource_version: str = ""
    #: the message explains a failure: it replaces an earlier ERROR (e.g. the same one without its log lines)
    force_message: bool = False


def observe(
    jobset: Obj,
    workload: Obj | None,
    pods: Sequence[Obj],
    *,
    now: datetime,
    grace: timedelta,
    position: QueuePosition | None = None,
    preemptor_priority: int | None = None,
    waiting_on: str = "",
    cluster_name: str = "",
    deleted_pods: Sequence[Obj] = (),
    jobs: Sequence[Obj] = (),
    tails: explain.Tails | None = None,
) -> Observation | None:
    key = execution_key(jobset)
    if key is None:
        return None
    state = to_work_unit_state(jobset)
    info = None
    if state == S.SCHEDULING:
        info = scheduling_information(jobset, workload, position, preemptor_priority=preemptor_priority,
                                      waiting_on=waiting_on or waiting_summary(pods))
    message = None
    force = False
    if state in (S.PARTIALLY_FAILED, S.FAILED):
        message = failure_explanation(pods, deleted_pods, jobset=jobset, jobs=jobs, tails=tails,
                                      waited_on=waiting_on or waiting_summary(pods))
        force = message is not None
    elif state in (S.STARTING, S.RUNNING, S.SCHEDULING):
        message = startup_diagnostic(jobset, pods, now=now, grace=grace)
        if state == S.STARTING and message is None:
            message = explain.crash_loop_message(jobset, pods, now)
        if state == S.SCHEDULING and message is None:
            message = explain.deactivation_message(workload)
    return Observation(
        key=key,
        state=state,
        detailed_status=jobset_status(jobset),
        scheduling_information=info,
        system_message=message,
        metadata=execution_metadata(jobset, workload, cluster_name=cluster_name),
        resource_version=str((jobset.get("metadata") or {}).get("resourceVersion") or ""),
        force_message=force,
    )
