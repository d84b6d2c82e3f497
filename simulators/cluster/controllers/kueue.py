"""Kueue, simulated: the JobSet integration, the scheduler and queue status.

Three parts, all acting only through the store:

* `kueue_jobset_admission` - Kueue's JobSet mutating/validating webhook as a
  store admission hook: fills `kueue.x-k8s.io/queue-name=default` when a
  LocalQueue `default` exists in the namespace, suspends a managed JobSet at
  CREATE, keeps the queue-name label immutable while the JobSet runs.
* `KueueJobReconciler` (key: the JobSet) - the generic job reconciler of
  upstream kubernetes-sigs/kueue ``pkg/controller/jobframework/reconciler.go``: one Workload per JobSet
  (`jobset-<name>-<hash>`, owned by it, finalizer
  `kueue.x-k8s.io/resource-in-use`), Finished on JobSet completion/failure,
  two-phase eviction (suspend the JobSet, then release quota once every
  replicated job reports `active == 0`, Requeued), unsuspending admitted
  JobSets with the podset labels and flavor node selectors, and suspending
  running JobSets that are not admitted; also the parts of Kueue's workload
  controller that act on a Workload: waitForPodsReady timeouts, stopped
  queues, deactivation, and admission checks in `Retry` (evict and requeue)
  or `Rejected` (deactivate) state.
* `KueueScheduler` (a thread) - admission cycles per ClusterQueue: pending
  Workloads ordered by priority, then creation time, then UID; flavor
  assignment against nominal quota plus what a one-level cohort lends
  (`borrowingLimit`, `lendingLimit`; `_QuotaTree`); classical preemption
  within the ClusterQueue and, with `reclaimWithinCohort` /
  `borrowWithinCohort`, in the cohort (`InClusterQueue`,
  `InCohortReclamation`, `InCohortReclaimWhileBorrowing`); `QuotaReserved` /
  `Admitted` / Inadmissible conditions; ClusterQueue and LocalQueue status;
  and the visibility API view (`KueueScheduler.pending_workloads`).

The queue configuration (flavors, queues, priority classes) is seeded from
YAML by `simulators.cluster.controllers.config`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Hashable, Iterable, cast

from simulators.cluster.clock import format_time, parse_time
from simulators.cluster.controllers.quantity import format_quantity, parse_quantity
from simulators.cluster.controllers.runtime import (
    controller_owner_name,
    CLUSTERQUEUES,
    JOBSETS,
    LOCALQUEUES,
    RESOURCEFLAVORS,
    WORKLOADS,
    Controller,
    ControllerContext,
    Obj,
    api_code,
    clone,
    status_copy,
    condition_true,
    controller_owner_uid,
    find_condition,
    is_deleting,
    owner_reference,
    set_condition,
)

log = logging.getLogger(__name__)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PODSET_LABEL = "kueue.x-k8s.io/podset"
LQ_LABEL = "kueue.x-k8s.io/local-queue-name"
CQ_LABEL = "kueue.x-k8s.io/cluster-queue-name"
FINALIZER = "kueue.x-k8s.io/resource-in-use"
WPC_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
PC_SOURCE = "scheduling.k8s.io/priorityclass"
COMPONENT_JOB = "kueue-job-controller"
COMPONENT_ADMISSION = "kueue-admission"


@dataclass
class KueueOptions:
    """Behaviour switches of the simulated Kueue (queue config file, `kueue:` section)."""

    granular_reasons: bool = True  # UnadmittedWorkloadsObservability (default on since v0.19)
    manage_jobs_without_queue_name: bool = False
    priority_classes: dict[str, int] = field(default_factory=dict)  # scheduling.k8s.io PriorityClass
    workload_priority_classes: dict[str, int] = field(default_factory=dict)
    default_priority_class: str | None = None  # a PriorityClass with globalDefault
    status_interval_wall: float = 0.2  # min wall seconds between queue status writes
    # waitForPodsReady (Kueue Configuration).  On by default since Kueue 0.19:
    # kueue apis/config/v1beta2/defaults.go (DefaultWaitForPodsReadyTimeout =
    # 30 min; recoveryTimeout defaults to the timeout; backoff base 60 s, max 3600 s).
    wait_for_pods_ready: bool = True
    pods_ready_timeout: float = 1800.0
    pods_ready_recovery_timeout: float | None = None  # None: same as pods_ready_timeout
    requeuing_backoff_base: float = 60.0
    requeuing_backoff_max: float = 3600.0
    requeuing_backoff_limit: int | None = None


def workload_name(jobset_name: str, jobset_uid: str) -> str:
    """`jobset-<name>-<5 hex>` exactly as Kueue names a JobSet's Workload."""
    digest = hashlib.sha1(f"JobSet\njobset.x-k8s.io\n{jobset_name}\n{jobset_uid}".encode()).hexdigest()
    return f"{('jobset-' + jobset_name)[:247]}-{digest[:5]}"


def _reason(opts: KueueOptions, granular: str) -> str:
    if opts.granular_reasons:
        return granular
    return "Inadmissible" if granular in ("Misconfigured", "Suspended") else "Pending"


def _count_eviction(status: dict[str, Any], reason: str, cause: str) -> None:
    """`status.schedulingStats.evictions[{reason, underlyingCause, count}]` += 1 (kueue pkg/workload/evict)."""
    stats = status.setdefault("schedulingStats", {}).setdefault("evictions", [])
    entry = next((e for e in stats if e.get("reason") == reason and (e.get("underlyingCause") or "") == cause), None)
    if entry is None:
        stats.append({"reason": reason, **({"underlyingCause": cause} if cause else {}), "count": 1})
    else:
        entry["count"] = int(entry.get("count") or 0) + 1


def _reset_checks(status: dict[str, Any], now: float) -> None:
    """Every admission check not Pending goes back to Pending on an eviction (kueue
    pkg/workload/evict/evict.go `resetChecksOnEviction`; a Retry adds 1 to `retryCount`)."""
    for check in status.get("admissionChecks") or []:
        state = check.get("state")
        if state == "Pending":
            continue
        if state == "Retry":
            check["retryCount"] = int(check.get("retryCount") or 0) + 1
        check.update(state="Pending", message=f"Reset to Pending after eviction. Previously: {state}",
                     lastTransitionTime=format_time(now))


# kueue pkg/scheduler/preemption/preemption.go `HumanReadablePreemptionReasons`
_PREEMPTION_REASONS = {
    "InClusterQueue": "prioritization in the ClusterQueue",
    "InCohortReclamation": "reclamation within the cohort",
    "InCohortFairSharing": "Fair Sharing within the cohort",
    "InCohortReclaimWhileBorrowing": "reclamation within the cohort while borrowing",
}


def _checks_message(checks: list[dict[str, Any]], state: str) -> str:
    """kueue pkg/controller/core/workload_controller.go `buildAdmissionChecksMessage`."""
    parts = [f'"{c.get("name")}" ({c["message"]})' if c.get("message") else f'"{c.get("name")}"'
             for c in sorted(checks, key=lambda c: str(c.get("name")))]
    noun = "AdmissionChecks" if len(checks) > 1 else "AdmissionCheck"
    return f"{noun} in {state} state: {'; '.join(parts)}"


def _resource_requests(wl: Obj) -> list[dict[str, Any]]:
    """`status.resourceRequests`: per podSet, the total requests of all its pods."""
    return [{"name": name, "resources": {r: format_quantity(q, r) for r, q in sorted(reqs.items())}}
            for name, _count, reqs in podset_requests(wl)]


def _cq_admission_checks(cq: Obj) -> list[str]:
    """AdmissionCheck names of a ClusterQueue: `spec.admissionChecks` or `admissionChecksStrategy`."""
    spec = cq.get("spec") or {}
    names = [str(n) for n in spec.get("admissionChecks") or []]
    for rule in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []:
        if rule.get("name") and rule["name"] not in names:
            names.append(str(rule["name"]))
    return sorted(names)


def _is_active_jobset(js: Obj) -> bool:
    return any(int(r.get("active") or 0) > 0 for r in (js.get("status") or {}).get("replicatedJobsStatus") or [])


def _jobset_finished(js: Obj) -> dict[str, Any] | None:
    for t in ("Completed", "Failed"):
        c = find_condition(js, t)
        if c and c.get("status") == "True":
            return c
    return None


def _quota_reserved(wl: Obj) -> bool:
    return bool((wl.get("status") or {}).get("admission"))


def pod_requests(pod_spec: dict[str, Any]) -> dict[str, Fraction]:
    """Per-pod requests: sum of containers (limits when no request), max with init containers."""
    total: dict[str, Fraction] = {}

    def add(into: dict[str, Fraction], c: dict[str, Any]) -> None:
        res = c.get("resources") or {}
        reqs = dict(res.get("limits") or {})
        reqs.update(res.get("requests") or {})
        for r, q in reqs.items():
            try:
                into[r] = into.get(r, Fraction(0)) + parse_quantity(q)
            except ValueError:
                continue

    sidecars: dict[str, Fraction] = {}
    for c in pod_spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            add(sidecars, c)
    for c in pod_spec.get("containers") or []:
        add(total, c)
    for r, q in sidecars.items():
        total[r] = total.get(r, Fraction(0)) + q
    for c in pod_spec.get("initContainers") or []:
        if c.get("restartPolicy") != "Always":
            one: dict[str, Fraction] = {}
            add(one, c)
            for r, q in one.items():
                total[r] = max(total.get(r, Fraction(0)), q + sidecars.get(r, Fraction(0)))
    return total


def podset_requests(wl: Obj) -> list[tuple[str, int, dict[str, Fraction]]]:
    """(podset name, count, total requests) for each podSet of a Workload."""
    out = []
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        count = int(ps.get("count") or 1)
        per_pod = pod_requests(((ps.get("template") or {}).get("spec")) or {})
        out.append((ps.get("name") or "main", count, {r: q * count for r, q in per_pod.items() if q}))
    return out


def workload_priority(wl: Obj) -> int:
    try:
        return int((wl.get("spec") or {}).get("priority") or 0)
    except (TypeError, ValueError):
        return 0


# --- webhook ------------------------------------------------------------------------


def kueue_jobset_mutate(obj: Obj, opts: KueueOptions, lq_exists: Any) -> None:
    """Kueue's JobSet defaulting webhook (CREATE): default queue name, suspend."""
    md = obj.setdefault("metadata", {})
    labels = md.setdefault("labels", {})
    ns = md.get("namespace") or "default"
    if not labels.get(QUEUE_LABEL) and lq_exists(ns, "default"):
        labels[QUEUE_LABEL] = "default"
    if not labels:
        md.pop("labels")
    managed = bool(labels.get(QUEUE_LABEL)) or opts.manage_jobs_without_queue_name
    if managed and (obj.get("spec") or {}).get("managedBy") in (None, "", "jobset.sigs.k8s.io/jobset-controller"):
        obj.setdefault("spec", {})["suspend"] = True


def kueue_jobset_validate_update(new: Obj, old: Obj, default_queue_exists: bool = False) -> list[str]:
    """kueue pkg/controller/jobframework/validation.go: the queue name may change only while the
    updated JobSet is suspended, and may not be removed in a namespace with a `default` LocalQueue."""
    old_q = ((old.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    new_q = ((new.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    errors = []
    if old_q and not new_q and default_queue_exists:
        errors.append(f"metadata.labels[{QUEUE_LABEL}]: Invalid value: \"\": queue-name must not be empty in namespace with default queue")
    if old_q != new_q and not (new.get("spec") or {}).get("suspend"):
        errors.append(f"metadata.labels[{QUEUE_LABEL}]: Invalid value: \"{new_q}\": field is immutable")
    return errors


# --- job reconciler ------------------------------------------------------------------


class KueueJobReconciler(Controller):
    """Kueue's reconciler for JobSets (keys: ("js", ns, name) and ("wl", ns, name))."""

    name = "kueue-jobs"
    workers = 2

    def __init__(self, ctx: ControllerContext, opts: KueueOptions) -> None:
        super().__init__(ctx)
        self.opts = opts
        self.cache.add_handler(JOBSETS.plural, self._on_jobset)
        self.cache.add_handler(WORKLOADS.plural, self._on_workload)
        self.cache.add_handler(CLUSTERQUEUES.plural, self._on_queue)
        self.cache.add_handler(LOCALQUEUES.plural, self._on_queue)

    def _on_queue(self, event: str, obj: Obj, old: Obj | None) -> None:
        """A queue's stopPolicy changed: look at every Workload again (drain or restart)."""
        if old is not None and (old.get("spec") or {}).get("stopPolicy") == (obj.get("spec") or {}).get("stopPolicy"):
            return
        for wl in self.cache.list(WORKLOADS.plural):
            owner = controller_owner_name(wl, "JobSet")
            if owner is not None:
                self.queue.add(("js", wl["metadata"].get("namespace") or "", owner))

    def _queue_stop(self, wl: Obj) -> tuple[str, str] | None:
        """(eviction reason, message) when the Workload's LocalQueue or ClusterQueue is
        `stopPolicy: HoldAndDrain` (kueue pkg/controller/core/workload_controller.go)."""
        ns = wl["metadata"].get("namespace") or ""
        lq = self.cache.get(LOCALQUEUES.plural, ns, (wl.get("spec") or {}).get("queueName") or "")
        cq_name = (((wl.get("status") or {}).get("admission") or {}).get("clusterQueue")
                   or ((lq or {}).get("spec") or {}).get("clusterQueue") or "")
        cq = self.cache.get(CLUSTERQUEUES.plural, "", cq_name)
        if ((cq or {}).get("spec") or {}).get("stopPolicy") == "HoldAndDrain":
            return "ClusterQueueStopped", "The ClusterQueue is stopped"
        if ((lq or {}).get("spec") or {}).get("stopPolicy") == "HoldAndDrain":
            return "LocalQueueStopped", "The LocalQueue is stopped"
        return None

    def _queue_stopped_at_all(self, wl: Obj, reason: str) -> bool:
        ns = wl["metadata"].get("namespace") or ""
        lq = self.cache.get(LOCALQUEUES.plural, ns, (wl.get("spec") or {}).get("queueName") or "")
        if reason == "LocalQueueStopped":
            return ((lq or {}).get("spec") or {}).get("stopPolicy", "None") not in ("None", None)
        cq = self.cache.get(CLUSTERQUEUES.plural, "", ((lq or {}).get("spec") or {}).get("clusterQueue") or "")
        return ((cq or {}).get("spec") or {}).get("stopPolicy", "None") not in ("None", None)

    def _on_jobset(self, event: str, obj: Obj, old: Obj | None) -> None:
        md = obj["metadata"]
        self.queue.add(("js", md.get("namespace") or "", md["name"]))
        if event == "DELETED":
            for wl in self.cache.owned(WORKLOADS.plural, md.get("uid") or ""):
                self.queue.add(("wl", wl["metadata"].get("namespace") or "", wl["metadata"]["name"]))

    def _on_workload(self, event: str, obj: Obj, old: Obj | None) -> None:
        md = obj["metadata"]
        ns = md.get("namespace") or ""
        owner = controller_owner_name(obj, "JobSet")
        if owner is not None:
            self.queue.add(("js", ns, owner))
        if event != "DELETED":
            self.queue.add(("wl", ns, md["name"]))

    def resync_keys(self) -> Iterable[Hashable]:
        keys: list[Hashable] = [("js", ns, n) for ns, n in self.cache.keys(JOBSETS.plural)]
        keys += [("wl", ns, n) for ns, n in self.cache.keys(WORKLOADS.plural)]
        return keys

    def reconcile(self, key: Hashable) -> float | None:
        kind, ns, name = cast(tuple[str, str, str], key)
        if kind == "wl":
            return self._reconcile_orphan(ns, name)
        return self._reconcile_jobset(ns, name)

    def _remove_finalizer(self, wl: Obj) -> None:
        fins = (wl.get("metadata") or {}).get("finalizers") or []
        if FINALIZER in fins:
            new = {**wl, "metadata": {**wl["metadata"], "finalizers": [f for f in fins if f != FINALIZER]}}
            self.ctx.update(WORKLOADS, new)

    def _reconcile_orphan(self, ns: str, name: str) -> float | None:
        """Workload whose JobSet is gone (or which is being deleted): release it."""
        wl = self.cache.get(WORKLOADS.plural, ns, name)
        if wl is None:
            return None
        owner = controller_owner_uid(wl)
        js = None
        for ref in wl["metadata"].get("ownerReferences") or ():
            if ref.get("uid") == owner:
                js = self.cache.get(JOBSETS.plural, ns, ref.get("name") or "")
        if js is not None and js["metadata"].get("uid") != owner:
            js = None
        if js is None or is_deleting(js):
            self._finish_owner_not_found(wl)
            self._remove_finalizer(wl)
        elif is_deleting(wl) and condition_true(wl, "Finished"):
            self._remove_finalizer(wl)
        return None

    def _finish_owner_not_found(self, wl: Obj) -> Obj:
        """The JobSet is gone while the Workload holds the finalizer: `Finished=True/OwnerNotFound`
        (kueue pkg/controller/jobframework/reconciler.go, the job-not-found path), which frees the quota."""
        if condition_true(wl, "Finished") or FINALIZER not in ((wl.get("metadata") or {}).get("finalizers") or []):
            return wl
        new = status_copy(wl)
        set_condition(new.setdefault("status", {}).setdefault("conditions", []), "Finished", "True", "OwnerNotFound",
                      "The workload's owner no longer exists", self.clock.now(),
                      observed_generation=wl["metadata"].get("generation"))
        try:
            return self.ctx.update_status(WORKLOADS, new)
        except Exception as exc:
            if api_code(exc) == 404:
                return wl
            raise

    def _reconcile_jobset(self, ns: str, name: str) -> float | None:
        js = self.cache.get(JOBSETS.plural, ns, name)
        if js is None:
            return None
        uid = js["metadata"]["uid"]
        wls = [w for w in self.cache.owned(WORKLOADS.plural, uid) if controller_owner_uid(w) == uid]
        if is_deleting(js):
            for owned in wls:
                self._remove_finalizer(self._finish_owner_not_found(owned))
            return None
        labels = js["metadata"].get("labels") or {}
        queue = labels.get(QUEUE_LABEL)
        if not queue and not self.opts.manage_jobs_without_queue_name:
            return None
        managed_by = (js.get("spec") or {}).get("managedBy")
        if managed_by and managed_by != "jobset.sigs.k8s.io/jobset-controller":
            return None
        wls.sort(key=lambda w: w["metadata"].get("creationTimestamp") or "")
        wl: Obj | None = wls[0] if wls else None
        for extra in wls[1:]:
            if self.ctx.delete(WORKLOADS, ns, extra["metadata"]["name"], uid=extra["metadata"]["uid"]):
                self.ctx.event(js, JOBSETS, "Normal", "DeletedWorkload", f"Deleted not matching Workload: {ns}/{extra['metadata']['name']}", COMPONENT_JOB)
        now = self.clock.now()
        suspended = bool((js.get("spec") or {}).get("suspend"))

        if wl is not None and condition_true(wl, "Finished"):
            self._remove_finalizer(wl)
            return None
        if wl is not None and is_deleting(wl):
            if not suspended:
                self._stop_job(js, wl, "Workload is being deleted")
            self._remove_finalizer(wl)
            return None
        done = _jobset_finished(js)
        if done is not None:
            if wl is not None:
                new = status_copy(wl)
                st = new.setdefault("status", {})
                reason = "Succeeded" if done["type"] == "Completed" else "Failed"
                set_condition(st.setdefault("conditions", []), "Finished", "True", reason, done.get("message") or "",
                              now, observed_generation=wl["metadata"].get("generation"))
                wl = self.ctx.update_status(WORKLOADS, new)
                self.ctx.event(js, JOBSETS, "Normal", "FinishedWorkload", f"Workload '{ns}/{wl['metadata']['name']}' is declared finished", COMPONENT_JOB)
                self._remove_finalizer(wl)
            return None
        if wl is None:
            if _is_active_jobset(js) or not suspended:
                if not suspended:
                    self._stop_job(js, None, "Not admitted by cluster queue")
                return None
            missing = self._missing_priority_class(js)
            if missing is not None:
                # kueue pkg/controller/jobframework/reconciler.go `prepareWorkload` ->
                # `ExtractPriority` fails on an unknown class: no Workload, the JobSet
                # stays suspended and the reconcile is retried.
                self.ctx.event(js, JOBSETS, "Warning", missing[0], missing[1], COMPONENT_JOB)
                return 10.0
            wl = self.ctx.create(WORKLOADS, self._construct_workload(js, queue or ""))
            self.ctx.event(js, JOBSETS, "Normal", "CreatedWorkload", f"Created Workload: {ns}/{wl['metadata']['name']}", COMPONENT_JOB)
            return None

        # Deactivation (spec.active=false) evicts like a preemption, without requeue.
        active_spec = (wl.get("spec") or {}).get("active", True) is not False
        if not active_spec and _quota_reserved(wl) and not condition_true(wl, "Evicted"):
            new = status_copy(wl)
            conds = new.setdefault("status", {}).setdefault("conditions", [])
            set_condition(conds, "Evicted", "True", "Deactivated", "The workload is deactivated", now,
                          observed_generation=wl["metadata"].get("generation"))
            self.ctx.update_status(WORKLOADS, new)
            self.ctx.event(wl, WORKLOADS, "Normal", "EvictedDueToDeactivated", "The workload is deactivated", COMPONENT_JOB)
            return None
        if not active_spec and not _quota_reserved(wl) and not condition_true(wl, "Evicted"):
            # kueue pkg/controller/core/workload_controller.go: an inactive Workload is
            # evicted with reason Deactivated even when it holds no quota; the
            # QuotaReserved reason becomes kueue.WorkloadDeactivated ("Deactivated").
            new = status_copy(wl)
            st = new.setdefault("status", {})
            conds = st.setdefault("conditions", [])
            gen = wl["metadata"].get("generation")
            message = "The workload is deactivated"
            set_condition(conds, "Evicted", "True", "Deactivated", message, now, observed_generation=gen)
            set_condition(conds, "Requeued", "False", "Deactivated", message, now, observed_generation=gen)
            set_condition(conds, "QuotaReserved", "False", "Deactivated" if self.opts.granular_reasons else "Inadmissible",
                          message, now, observed_generation=gen)
            st.pop("requeueState", None)
            _count_eviction(st, "Deactivated", "")
            self.ctx.update_status(WORKLOADS, new)
            self.ctx.event(wl, WORKLOADS, "Normal", "EvictedDueToDeactivated", message, COMPONENT_JOB)
            return None
        if active_spec and not _quota_reserved(wl):
            ev = find_condition(wl, "Evicted")
            rq = find_condition(wl, "Requeued")
            if ev and ev.get("status") == "True" and str(ev.get("reason") or "").startswith("Deactivated") \
                    and rq and rq.get("status") == "False":
                new = status_copy(wl)
                conds = new["status"]["conditions"]
                set_condition(conds, "Requeued", "True", "Reactivated", "The workload was reactivated", now,
                              observed_generation=wl["metadata"].get("generation"))
                self.ctx.update_status(WORKLOADS, new)
                return None
            if ev and ev.get("status") == "True" and ev.get("reason") in ("ClusterQueueStopped", "LocalQueueStopped") \
                    and rq and rq.get("status") == "False" and not self._queue_stopped_at_all(wl, ev["reason"]):
                # The queue was restarted (stopPolicy None): back in the queue.
                kind = "ClusterQueue" if ev["reason"] == "ClusterQueueStopped" else "LocalQueue"
                new = status_copy(wl)
                set_condition(new["status"]["conditions"], "Requeued", "True", f"{kind}Restarted",
                              f"The {kind} was restarted after being stopped", now, observed_generation=wl["metadata"].get("generation"))
                self.ctx.update_status(WORKLOADS, new)
                return None
            if ev and ev.get("status") == "True" and ev.get("reason") in ("PodsReadyTimeout", "AdmissionCheck") \
                    and rq and rq.get("status") == "False":
                at = parse_time((((wl.get("status") or {}).get("requeueState")) or {}).get("requeueAt"))
                if at is not None and now < at:
                    return at - now
                new = status_copy(wl)
                set_condition(new["status"]["conditions"], "Requeued", "True", "BackoffFinished",
                              "The workload backoff was finished", now, observed_generation=wl["metadata"].get("generation"))
                self.ctx.update_status(WORKLOADS, new)
                return None

        if active_spec and _quota_reserved(wl) and not condition_true(wl, "Evicted") and self._check_based_eviction(wl, now):
            return None
        if not active_spec and not _quota_reserved(wl) and condition_true(wl, "Evicted"):
            # kueue pkg/controller/core/workload_controller.go `syncQuotaReservedFalseCondition`:
            # an inactive Workload without quota shows QuotaReserved=False/Deactivated (the
            # legacy, non-granular reasons leave the condition as it is).
            qr = find_condition(wl, "QuotaReserved") or {}
            if self.opts.granular_reasons and (qr.get("status"), qr.get("reason")) != ("False", "Deactivated"):
                new = status_copy(wl)
                set_condition(new["status"].setdefault("conditions", []), "QuotaReserved", "False", "Deactivated",
                              "The workload is deactivated", now, observed_generation=wl["metadata"].get("generation"))
                self.ctx.update_status(WORKLOADS, new)
                return None

        requeue_after: float | None = None
        if self.opts.wait_for_pods_ready:
            # kueue pkg/controller/jobframework/reconciler.go: with waitForPodsReady
            # the PodsReady condition is kept on every Workload (WaitForStart while
            # not admitted, also after an eviction), before the eviction handling.
            wrote, requeue_after = self._sync_pods_ready(js, wl, now)
            if wrote:
                return None

        checks = (wl.get("status") or {}).get("admissionChecks") or []
        if _quota_reserved(wl) and checks and not condition_true(wl, "Admitted") and not condition_true(wl, "Evicted") \
                and all(c.get("state") == "Ready" for c in checks):
            # Every AdmissionCheck is Ready: Admitted (kueue pkg/workload/admissionchecks.go SyncAdmittedCondition).
            new = status_copy(wl)
            set_condition(new["status"]["conditions"], "Admitted", "True", "Admitted", "The workload is admitted", now,
                          observed_generation=wl["metadata"].get("generation"))
            out = self.ctx.update_status(WORKLOADS, new)
            cq = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue") or ""
            self.ctx.event(out, WORKLOADS, "Normal", "Admitted", f"Admitted by ClusterQueue {cq}, wait time since reservation was "
                           f"{int(max(0, now - (parse_time((find_condition(wl, 'QuotaReserved') or {}).get('lastTransitionTime')) or now)))}s",
                           COMPONENT_JOB)
            return None
        if _quota_reserved(wl) and not condition_true(wl, "Evicted"):
            stop = self._queue_stop(wl)
            if stop is not None:
                new = status_copy(wl)
                st = new["status"]
                set_condition(st.setdefault("conditions", []), "Evicted", "True", stop[0], stop[1], now,
                              observed_generation=wl["metadata"].get("generation"))
                _count_eviction(st, stop[0], "")
                out = self.ctx.update_status(WORKLOADS, new)
                self.ctx.event(out, WORKLOADS, "Normal", f"EvictedDueTo{stop[0]}", stop[1], COMPONENT_JOB)
                return None
        evicted = find_condition(wl, "Evicted")
        if evicted and evicted.get("status") == "True" and _quota_reserved(wl):
            if not suspended:
                self._stop_job(js, wl, evicted.get("message") or "")
                return None
            if _is_active_jobset(js):
                return None  # wait until the JobSet reports active == 0 everywhere
            self._release(wl, evicted, now)
            return None
        if suspended:
            if condition_true(wl, "Admitted"):
                self._start_job(js, wl)
            return requeue_after
        if not condition_true(wl, "Admitted"):
            self._stop_job(js, wl, "Not admitted by cluster queue")
        return requeue_after

    def _sync_pods_ready(self, js: Obj, wl: Obj, now: float) -> tuple[bool, float | None]:
        """waitForPodsReady: the PodsReady condition, the timeout and recovery-timeout evictions.

        Returns (wrote something, simulated seconds until the next timeout check).
        The condition follows kueue pkg/controller/jobframework/reconciler.go
        `generatePodsReadyCondition`; the timeouts follow kueue
        pkg/controller/core/workload_controller.go `reconcileNotReadyTimeout` /
        `admittedNotReadyWorkload` / `triggerDeactivation`, the back-off kueue
        pkg/workload/workload.go `UpdateRequeueState`.
        """
        md = wl["metadata"]
        gen = md.get("generation")
        cond = find_condition(wl, "PodsReady")

        def write(status: str, reason: str, message: str) -> tuple[bool, float | None]:
            new = status_copy(wl)
            set_condition(new.setdefault("status", {}).setdefault("conditions", []), "PodsReady", status, reason, message, now,
                          observed_generation=gen)
            self.ctx.update_status(WORKLOADS, new)
            return True, None

        if not condition_true(wl, "Admitted"):
            if cond is None or (cond.get("status"), cond.get("reason")) != ("False", "WaitForStart"):
                return write("False", "WaitForStart", "Not all pods are ready or succeeded")
            return False, None
        total = sum(int(r.get("replicas", 1)) for r in (js.get("spec") or {}).get("replicatedJobs") or [])
        counts = (js.get("status") or {}).get("replicatedJobsStatus") or []
        ready = not (js.get("spec") or {}).get("suspend") and total > 0 and \
            sum(int(c.get("ready") or 0) + int(c.get("succeeded") or 0) for c in counts) >= total
        if ready:
            if cond is not None and cond.get("status") == "True":
                return False, None
            reason = "Recovered" if cond is not None and cond.get("reason") in ("WaitForRecovery", "Recovered") else "Started"
            return write("True", reason, "All pods reached readiness and the workload is running")
        if cond is not None and cond.get("status") == "True":
            return write("False", "WaitForRecovery", "At least one pod has failed, waiting for recovery")
        if cond is None or cond.get("reason") not in ("WaitForStart", "WaitForRecovery", "PodsReady"):
            return write("False", "WaitForStart", "Not all pods are ready or succeeded")
        if condition_true(wl, "Evicted") or (wl.get("spec") or {}).get("active", True) is False:
            return False, None  # already being evicted or deactivated
        if cond.get("reason") == "WaitForRecovery":
            cause = "WaitForRecovery"
            recovery = self.opts.pods_ready_recovery_timeout
            timeout = self.opts.pods_ready_timeout if recovery is None else recovery
            deadline = (parse_time(cond.get("lastTransitionTime")) or now) + timeout
        else:
            cause = "WaitForStart"
            admitted = find_condition(wl, "Admitted") or {}
            deadline = (parse_time(admitted.get("lastTransitionTime")) or now) + self.opts.pods_ready_timeout
        if now < deadline:
            return False, deadline - now
        state = (wl.get("status") or {}).get("requeueState") or {}
        count = int(state.get("count") or 0) + 1
        limit = self.opts.requeuing_backoff_limit
        if limit is not None and count > limit:
            self._deactivate_requeuing_limit(wl, now)
            return True, None
        new = status_copy(wl)
        st = new["status"]
        conds = st.setdefault("conditions", [])
        delay = min(self.opts.requeuing_backoff_max, self.opts.requeuing_backoff_base * 2.0 ** (count - 1))
        st["requeueState"] = {**(st.get("requeueState") or {}), "count": count, "requeueAt": format_time(now + delay)}
        message = f"Exceeded the PodsReady timeout {md.get('namespace')}/{md['name']}"
        set_condition(conds, "Evicted", "True", "PodsReadyTimeout", message, now, observed_generation=gen)
        _count_eviction(st, "PodsReadyTimeout", cause)
        out = self.ctx.update_status(WORKLOADS, new)
        self.ctx.event(out, WORKLOADS, "Normal", "EvictedDueToPodsReadyTimeout", message, COMPONENT_JOB)
        return True, None

    def _deactivate_requeuing_limit(self, wl: Obj, now: float) -> None:
        """Requeuing limit exceeded (kueue pkg/controller/core/workload_controller.go `triggerDeactivation`)."""
        self._deactivate(wl, "RequeuingLimitExceeded", "exceeding the maximum number of re-queuing retries", now)

    def _deactivate(self, wl: Obj, cause: str, target_message: str, now: float,
                    event: tuple[str, str, str] | None = None) -> None:
        """`DeactivationTarget=True/<cause>`, then `spec.active=false` and the eviction.

        kueue pkg/controller/core/workload_controller.go: the DeactivationTarget
        condition makes the next pass set `spec.active=false`; an inactive
        Workload is then evicted with `Deactivated` plus the cause
        (`DeactivatedDueTo<cause>`, "The workload is deactivated due to
        <target message>"), `requeueState` cleared, DeactivationTarget removed,
        the eviction counted as `{reason: Deactivated, underlyingCause: <cause>}`.
        `event` is recorded once the DeactivationTarget is written.
        """
        md = wl["metadata"]
        new = status_copy(wl)
        set_condition(new["status"].setdefault("conditions", []), "DeactivationTarget", "True", cause,
                      target_message, now, observed_generation=md.get("generation"))
        wl = self.ctx.update_status(WORKLOADS, new)
        if event is not None:
            self.ctx.event(wl, WORKLOADS, *event, COMPONENT_JOB)
        wl = self.ctx.update(WORKLOADS, {**wl, "spec": {**(wl.get("spec") or {}), "active": False}})
        message = f"The workload is deactivated due to {target_message}"
        new = status_copy(wl)
        st = new["status"]
        st.pop("requeueState", None)
        st["conditions"] = [c for c in st.get("conditions") or [] if c.get("type") != "DeactivationTarget"]
        set_condition(st["conditions"], "Evicted", "True", f"DeactivatedDueTo{cause}", message, now,
                      observed_generation=wl["metadata"].get("generation"))
        _reset_checks(st, now)
        _count_eviction(st, "Deactivated", cause)
        self.ctx.update_status(WORKLOADS, new)
        self.ctx.event(wl, WORKLOADS, "Normal", f"EvictedDueToDeactivatedDueTo{cause}", message, COMPONENT_JOB)

    def _check_based_eviction(self, wl: Obj, now: float) -> bool:
        """An admission check in `Rejected` or `Retry` state (kueue pkg/controller/core/workload_controller.go
        `reconcileCheckBasedEviction`); returns whether it wrote.

        Rejected: Warning event `AdmissionCheckRejected` "Deactivated due to
        AdmissionCheck in Rejected state: "<check>" (<message>)" and the Workload is
        deactivated (`DeactivatedDueToAdmissionCheck`; it is not requeued).
        Retry: `Evicted=True/AdmissionCheck` "Evicted due to AdmissionCheck in Retry
        state: ..." (states reset to Pending, `retryCount` +1), the two-phase stop,
        `Requeued=False/AdmissionCheck` until `requeueState.requeueAt` (the latest
        `lastTransitionTime + requeueAfterSeconds` of the Retry checks, kueue
        pkg/workload/admissionchecks.go `NeedsRequeueAtUpdate`; none: at once), then
        `Requeued=True/BackoffFinished` and back in the queue.
        """
        checks = (wl.get("status") or {}).get("admissionChecks") or []
        rejected = [c for c in checks if c.get("state") == "Rejected"]
        if rejected:
            message = _checks_message(rejected, "Rejected")
            self._deactivate(wl, "AdmissionCheck", message, now,
                             event=("Warning", "AdmissionCheckRejected", f"Deactivated due to {message}"))
            return True
        retry = [c for c in checks if c.get("state") == "Retry"]
        if not retry:
            return False
        message = f"Evicted due to {_checks_message(retry, 'Retry')}"
        new = status_copy(wl)
        st = new["status"]
        retry_at = max((t + float(c["requeueAfterSeconds"]) for c in retry
                        if c.get("requeueAfterSeconds") is not None and (t := parse_time(c.get("lastTransitionTime"))) is not None),
                       default=None)
        if retry_at is not None and retry_at > now:
            st["requeueState"] = {**(st.get("requeueState") or {}), "requeueAt": format_time(retry_at)}
        set_condition(st.setdefault("conditions", []), "Evicted", "True", "AdmissionCheck", message, now,
                      observed_generation=wl["metadata"].get("generation"))
        _reset_checks(st, now)
        _count_eviction(st, "AdmissionCheck", "")
        out = self.ctx.update_status(WORKLOADS, new)
        self.ctx.event(out, WORKLOADS, "Normal", "EvictedDueToAdmissionCheck", message, COMPONENT_JOB)
        return True

    def _missing_priority_class(self, js: Obj) -> tuple[str, str] | None:
        """(event reason, message) when the JobSet names a priority class that does not exist."""
        wpc = ((js.get("metadata") or {}).get("labels") or {}).get(PRIORITY_LABEL)
        if wpc:
            if wpc not in self.opts.workload_priority_classes:
                return ("WorkloadPriorityClassNotFound",
                        f'workloadpriorityclasses.kueue.x-k8s.io "{wpc}" not found')
            return None
        for rjob in (js.get("spec") or {}).get("replicatedJobs") or []:
            pc = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get("priorityClassName")
            if pc:
                if pc not in self.opts.priority_classes:
                    return ("PriorityClassNotFound", f'priorityclasses.scheduling.k8s.io "{pc}" not found')
                return None
        return None

    def _construct_workload(self, js: Obj, queue: str) -> Obj:
        md = js["metadata"]
        spec = js.get("spec") or {}
        pod_sets = []
        pc_name = None
        for rjob in spec.get("replicatedJobs") or []:
            jspec = (rjob.get("template") or {}).get("spec") or {}
            parallelism = int(jspec["parallelism"]) if jspec.get("parallelism") is not None else 1
            completions = jspec.get("completions")
            per_replica = min(parallelism, int(completions)) if completions is not None else parallelism
            tmpl = clone(jspec.get("template") or {})
            pc_name = pc_name or (tmpl.get("spec") or {}).get("priorityClassName")
            pod_sets.append({"name": str(rjob["name"]).lower(), "count": int(rjob.get("replicas", 1)) * per_replica,
                             "template": tmpl})
        wspec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets, "active": True, "priority": 0}
        wpc = (md.get("labels") or {}).get(PRIORITY_LABEL)
        # v1beta2 (the storage version): spec.priorityClassRef; v1beta1 readers see
        # priorityClassName + priorityClassSource (simulators.cluster.versions).
        if wpc:
            wspec.update(priorityClassRef={"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": wpc},
                         priority=int(self.opts.workload_priority_classes.get(wpc, 0)))
        elif pc_name:
            wspec.update(priorityClassRef={"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pc_name},
                         priority=int(self.opts.priority_classes.get(pc_name, 0)))
        elif self.opts.default_priority_class:
            pc = self.opts.default_priority_class
            wspec.update(priorityClassRef={"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pc},
                         priority=int(self.opts.priority_classes.get(pc, 0)))
        wl_md: dict[str, Any] = {
            "name": workload_name(md["name"], md["uid"]),
            "namespace": md.get("namespace") or "default",
            "labels": {JOB_UID_LABEL: md["uid"]},
            "finalizers": [FINALIZER],
            "ownerReferences": [owner_reference(js, JOBSETS)],
        }
        max_exec = (md.get("labels") or {}).get("kueue.x-k8s.io/max-exec-time-seconds")
        if max_exec:
            try:
                wspec["maximumExecutionTimeSeconds"] = int(max_exec)
            except ValueError:
                pass  # Kueue's webhook would reject it; the simulator ignores the label
        return {"apiVersion": WORKLOADS.api_version, "kind": "Workload", "metadata": wl_md, "spec": wspec}

    def _stop_job(self, js: Obj, wl: Obj | None, message: str) -> None:
        """Suspend the JobSet and restore the pod templates of the Workload's podSets."""
        new = clone(js)
        new["spec"]["suspend"] = True
        if wl is not None:
            pod_sets = {ps.get("name"): ps for ps in (wl.get("spec") or {}).get("podSets") or []}
            for rjob in new["spec"].get("replicatedJobs") or []:
                ps = pod_sets.get(str(rjob.get("name")).lower())
                if ps is None:
                    continue
                tmpl = rjob.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
                orig = ps.get("template") or {}
                omd, ospec = orig.get("metadata") or {}, orig.get("spec") or {}
                tmd = tmpl.setdefault("metadata", {})
                for f in ("labels", "annotations"):
                    if omd.get(f):
                        tmd[f] = clone(omd[f])
                    else:
                        tmd.pop(f, None)
                tspec = tmpl.setdefault("spec", {})
                for f in ("nodeSelector", "tolerations", "schedulingGates"):
                    if ospec.get(f):
                        tspec[f] = clone(ospec[f])
                    else:
                        tspec.pop(f, None)
        js = self.ctx.update(JOBSETS, new)
        self.ctx.event(js, JOBSETS, "Normal", "Stopped", message, COMPONENT_JOB)

    def _start_job(self, js: Obj, wl: Obj) -> None:
        """Unsuspend an admitted JobSet, merging podset labels and flavor node labels."""
        admission = (wl.get("status") or {}).get("admission") or {}
        cq = admission.get("clusterQueue") or ""
        assignments = {a.get("name"): a for a in admission.get("podSetAssignments") or []}
        new = clone(js)
        new["spec"]["suspend"] = False
        for rjob in new["spec"].get("replicatedJobs") or []:
            ps_name = str(rjob.get("name")).lower()
            tmpl = rjob.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
            tmd = tmpl.setdefault("metadata", {})
            tmd["labels"] = {**(tmd.get("labels") or {}), PODSET_LABEL: ps_name,
                             LQ_LABEL: (wl.get("spec") or {}).get("queueName") or "", CQ_LABEL: cq}
            node_labels: dict[str, str] = {}
            tolerations: list[Any] = []
            for flavor_name in sorted(set(((assignments.get(ps_name) or {}).get("flavors") or {}).values())):
                flavor = self.cache.get(RESOURCEFLAVORS.plural, "", flavor_name) or {}
                node_labels.update((flavor.get("spec") or {}).get("nodeLabels") or {})
                tolerations += (flavor.get("spec") or {}).get("tolerations") or []
            tspec = tmpl.setdefault("spec", {})
            if node_labels:
                tspec["nodeSelector"] = {**(tspec.get("nodeSelector") or {}), **node_labels}
            if tolerations:
                tspec["tolerations"] = list(tspec.get("tolerations") or []) + [t for t in tolerations if t not in (tspec.get("tolerations") or [])]
        js = self.ctx.update(JOBSETS, new)
        self.ctx.event(js, JOBSETS, "Normal", "Started", f"Admitted by clusterQueue {cq}", COMPONENT_JOB)

    def _release(self, wl: Obj, evicted: dict[str, Any], now: float) -> None:
        """Second phase of an eviction: the JobSet is stopped, give the quota back."""
        new = status_copy(wl)
        st = new.setdefault("status", {})
        conds = st.setdefault("conditions", [])
        gen = wl["metadata"].get("generation")
        reason = evicted.get("reason") or "Preempted"
        message = evicted.get("message") or ""
        requeue = reason in ("Preempted", "NodeFailures")
        set_condition(conds, "Requeued", "True" if requeue else "False", reason, message, now, observed_generation=gen)
        set_condition(conds, "QuotaReserved", "False", _reason(self.opts, "PendingEvaluation"), message, now, observed_generation=gen)
        set_condition(conds, "Admitted", "False", "NoReservation", "The workload has no reservation", now, observed_generation=gen)
        st.pop("admission", None)
        _reset_checks(st, now)  # evictions written before this one already did it
        admitted_at = parse_time((find_condition(wl, "Admitted") or {}).get("lastTransitionTime"))
        if admitted_at is not None and condition_true(wl, "Admitted"):
            st["accumulatedPastExecutionTimeSeconds"] = int(st.get("accumulatedPastExecutionTimeSeconds") or 0) + int(max(0, now - admitted_at))
        self.ctx.update_status(WORKLOADS, new)


# --- scheduler ------------------------------------------------------------------------


class UnknownQueue(LookupError):
    """The visibility API was asked about a queue that does not exist (HTTP 404)."""


@dataclass
class _CQView:
    name: str
    obj: Obj
    usage: dict[tuple[str, str], Fraction] = field(default_factory=dict)  # (flavor, resource) -> used
    pending: list[Obj] = field(default_factory=list)
    admitted: list[Obj] = field(default_factory=list)
    reserving: int = 0
    admitted_count: int = 0

    def nominal(self) -> dict[tuple[str, str], Fraction]:
        out: dict[tuple[str, str], Fraction] = {}
        for group in (self.obj.get("spec") or {}).get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                for res in flavor.get("resources") or []:
                    out[(flavor.get("name"), res.get("name"))] = _opt_quantity(res.get("nominalQuota", 0)) or Fraction(0)
        return out


FR = tuple[str, str]  # (flavor, resource)


def _opt_quantity(v: Any) -> Fraction | None:
    if v is None:
        return None
    try:
        return parse_quantity(v)
    except ValueError:
        return None


class _QuotaTree:
    """Nominal quota, borrowing and lending of every ClusterQueue in one scheduling cycle.

    One level of cohorts, as kueue pkg/cache/scheduler/resource_node.go computes it
    for ClusterQueues whose parent is a cohort without quota of its own: a
    ClusterQueue keeps `nominal - lendingLimit` for itself (its local quota), lends
    the rest to the cohort (the cohort's quota is the sum of what its members lend)
    and stores in the cohort the usage past its local quota.  `available` is what it
    can still use now (`available`), `potential` the most it could ever use
    (`potentialAvailable`), both bounded by its `borrowingLimit` (unset: unlimited).
    Usage changes are applied incrementally, so a check is O(1).
    """

    def __init__(self, views: dict[str, _CQView]) -> None:
        self.views = views
        self.cohort_of: dict[str, str | None] = {}
        self.members: dict[str, list[str]] = {}
        self.quota: dict[str, dict[FR, tuple[Fraction, Fraction | None, Fraction | None]]] = {}
        self.usage: dict[str, dict[FR, Fraction]] = {}
        self.c_quota: dict[str, dict[FR, Fraction]] = {}
        self.c_usage: dict[str, dict[FR, Fraction]] = {}
        for name, view in views.items():
            spec = view.obj.get("spec") or {}
            cohort = spec.get("cohortName") or None
            self.cohort_of[name] = cohort
            q: dict[FR, tuple[Fraction, Fraction | None, Fraction | None]] = {}
            for group in spec.get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    for res in flavor.get("resources") or []:
                        k = (flavor.get("name") or "", res.get("name") or "")
                        q[k] = (_opt_quantity(res.get("nominalQuota", 0)) or Fraction(0),
                                _opt_quantity(res.get("borrowingLimit")) if cohort else None,
                                _opt_quantity(res.get("lendingLimit")) if cohort else None)
            self.quota[name] = q
            self.usage[name] = dict(view.usage)
            if cohort is None:
                continue
            self.members.setdefault(cohort, []).append(name)
            cq_, cu = self.c_quota.setdefault(cohort, {}), self.c_usage.setdefault(cohort, {})
            for k, (nominal, _b, _l) in q.items():
                cq_[k] = cq_.get(k, Fraction(0)) + nominal - self._local(name, k)
            for k, used in self.usage[name].items():
                cu[k] = cu.get(k, Fraction(0)) + max(Fraction(0), used - self._local(name, k))

    def _local(self, cq: str, k: FR) -> Fraction:
        """Quota only this ClusterQueue may use (`localQuota`): nominal - lendingLimit."""
        nominal, _b, lend = self.quota[cq].get(k, (Fraction(0), None, None))
        return max(Fraction(0), nominal - lend) if lend is not None else Fraction(0)

    def nominal(self, cq: str, k: FR) -> Fraction:
        return self.quota[cq].get(k, (Fraction(0), None, None))[0]

    def used(self, cq: str, k: FR) -> Fraction:
        return self.usage[cq].get(k, Fraction(0))

    def borrowing(self, cq: str, k: FR) -> bool:
        return self.used(cq, k) > self.nominal(cq, k)

    def available(self, cq: str, k: FR) -> Fraction:
        """Quota the ClusterQueue can use now, borrowing included (kueue `Available`)."""
        nominal, borrow, _l = self.quota[cq].get(k, (Fraction(0), None, None))
        used = self.used(cq, k)
        cohort = self.cohort_of.get(cq)
        if cohort is None:
            return max(Fraction(0), nominal - used)
        local = self._local(cq, k)
        parent = self.c_quota[cohort].get(k, Fraction(0)) - self.c_usage[cohort].get(k, Fraction(0))
        if borrow is not None:
            parent = min(parent, (nominal - local) - max(Fraction(0), used - local) + borrow)
        return max(Fraction(0), max(Fraction(0), local - used) + parent)

    def potential(self, cq: str, k: FR) -> Fraction:
        """The most the ClusterQueue could use with nothing else running (kueue `PotentialAvailable`)."""
        nominal, borrow, _l = self.quota[cq].get(k, (Fraction(0), None, None))
        cohort = self.cohort_of.get(cq)
        if cohort is None:
            return nominal
        avail = self._local(cq, k) + self.c_quota[cohort].get(k, Fraction(0))
        return min(avail, nominal + borrow) if borrow is not None else avail

    def add(self, cq: str, usage: dict[FR, Fraction], sign: int = 1) -> None:
        """Add (sign 1) or remove (sign -1) a Workload's usage (kueue `addUsage` / `removeUsage`)."""
        cohort = self.cohort_of.get(cq)
        mine = self.usage[cq]
        for k, q in usage.items():
            before = mine.get(k, Fraction(0))
            after = before + sign * q
            mine[k] = after
            if cohort is not None:
                local = self._local(cq, k)
                cu = self.c_usage[cohort]
                cu[k] = cu.get(k, Fraction(0)) + max(Fraction(0), after - local) - max(Fraction(0), before - local)

    def path(self, cq: str) -> str:
        """`/<cohort>/<cq>` (kueue pkg/scheduler/preemption/preemption.go `buildCQPath`)."""
        cohort = self.cohort_of.get(cq)
        return f"/{cohort}/{cq}" if cohort else f"/{cq}"


def _creation_rv(wl: Obj) -> int:
    """Creation order: the Workload name's first resourceVersion we saw (see `KueueScheduler._first_rv`)."""
    return int(_FIRST_RV.get((wl.get("metadata") or {}).get("uid") or "", 0))


# uid -> resourceVersion at which the Workload was first seen.  Real Kueue breaks
# ties between Workloads created in the same second by UID (random); the
# simulator uses creation order instead, so FIFO is deterministic.
_FIRST_RV: dict[str, int] = {}


_USAGE_MEMO: dict[str, tuple[str, dict[tuple[str, str], Fraction]]] = {}


def _admitted_usage(wl: Obj) -> dict[tuple[str, str], Fraction]:
    """(flavor, resource) -> quantity held by an admitted Workload (memoised per resourceVersion)."""
    md = wl.get("metadata") or {}
    uid, rv = md.get("uid") or "", str(md.get("resourceVersion") or "")
    hit = _USAGE_MEMO.get(uid)
    if hit is not None and hit[0] == rv:
        return hit[1]
    out: dict[tuple[str, str], Fraction] = {}
    for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        flavors = psa.get("flavors") or {}
        for res, qty in (psa.get("resourceUsage") or {}).items():
            k = (flavors.get(res) or "", res)
            try:
                out[k] = out.get(k, Fraction(0)) + parse_quantity(qty)
            except ValueError:
                continue  # not a quantity: counts as nothing
    if len(_USAGE_MEMO) > 100_000:
        _USAGE_MEMO.clear()
    _USAGE_MEMO[uid] = (rv, out)
    return out


def _queue_key(wl: Obj) -> tuple[int, float, int, str]:
    """Queue order: priority, then the queue-order timestamp (kueue pkg/workload `GetQueueOrderTimestamp`
    with requeuingStrategy.timestamp Eviction, the default: the eviction time for a Workload evicted by
    PodsReadyTimeout or an admission check, else the creation time), then creation order."""
    md = wl.get("metadata") or {}
    ts = parse_time(md.get("creationTimestamp")) or 0.0
    ev = find_condition(wl, "Evicted")
    if ev and ev.get("status") == "True" and ev.get("reason") in ("PodsReadyTimeout", "AdmissionCheck"):
        ts = parse_time(ev.get("lastTransitionTime")) or ts
    return (-workload_priority(wl), ts, _creation_rv(wl), md.get("uid") or "")


class KueueScheduler:
    """Admission cycles, preemption, queue status and the visibility view."""

    def __init__(self, ctx: ControllerContext, opts: KueueOptions) -> None:
        self.ctx = ctx
        self.cache = ctx.cache
        self.clock = ctx.clock
        self.opts = opts
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_status_write = 0.0
        self._status_dirty = True
        self._status_timer = False
        self._cycle_evicted: set[str] = set()  # UIDs preempted in the current cycle
        self.cycles = 0
        for plural in (WORKLOADS.plural, CLUSTERQUEUES.plural, LOCALQUEUES.plural, RESOURCEFLAVORS.plural):
            self.cache.add_handler(plural, self._on_change)

    def _on_change(self, event: str, obj: Obj, old: Obj | None) -> None:
        if obj.get("kind") == "Workload":
            uid = (obj.get("metadata") or {}).get("uid") or ""
            if event == "DELETED":
                _FIRST_RV.pop(uid, None)
            elif uid not in _FIRST_RV:
                _FIRST_RV[uid] = int((obj.get("metadata") or {}).get("resourceVersion") or 0)
        if obj.get("kind") in ("ClusterQueue", "LocalQueue") and event == "MODIFIED" and old is not None \
                and old.get("spec") == obj.get("spec") and (old.get("metadata") or {}).get("labels") == (obj.get("metadata") or {}).get("labels"):
            return  # our own status writes
        self._status_dirty = True
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sim-kueue-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=1.0)
            if self._stop.is_set():
                return
            time.sleep(0.01)  # coalesce bursts of changes into one cycle
            self._wake.clear()
            try:
                again = self.cycle()
            except Exception as exc:
                if api_code(exc) not in (404, 409):
                    log.exception("sim.kueue.cycle_failed")
                again = True
            if again:
                self._wake.set()

    # --- snapshot ------------------------------------------------------------------

    def _snapshot(self) -> tuple[dict[str, _CQView], list[tuple[Obj, str, str]]]:
        """ClusterQueue views with usage and pending lists, plus misconfigured workloads."""
        cqs = {o["metadata"]["name"]: _CQView(o["metadata"]["name"], o) for o in self.cache.list(CLUSTERQUEUES.plural)}
        lqs = {(o["metadata"].get("namespace") or "", o["metadata"]["name"]): o for o in self.cache.list(LOCALQUEUES.plural)}
        misconfigured: list[tuple[Obj, str, str]] = []
        for wl in self.cache.list(WORKLOADS.plural):
            if condition_true(wl, "Finished") or is_deleting(wl):
                continue
            st = wl.get("status") or {}
            adm = st.get("admission")
            if adm:
                view = cqs.get(adm.get("clusterQueue") or "")
                if view is None:
                    continue
                view.admitted.append(wl)
                view.reserving += 1
                if condition_true(wl, "Admitted"):
                    view.admitted_count += 1
                for k, q in _admitted_usage(wl).items():
                    view.usage[k] = view.usage.get(k, Fraction(0)) + q
                continue
            if (wl.get("spec") or {}).get("active", True) is False:
                continue
            requeued = find_condition(wl, "Requeued")
            if requeued is not None and requeued.get("status") == "False":
                continue  # not back in the queue yet (e.g. deactivated, until Reactivated)
            ns = wl["metadata"].get("namespace") or ""
            lq_name = (wl.get("spec") or {}).get("queueName") or ""
            lq = lqs.get((ns, lq_name))
            if lq is None:
                misconfigured.append((wl, "Misconfigured", f"LocalQueue {lq_name} doesn't exist"))
                continue
            if ((lq.get("spec") or {}).get("stopPolicy") or "None") != "None":
                misconfigured.append((wl, "Suspended", f"LocalQueue {lq_name} is inactive"))
                continue
            cq_name = (lq.get("spec") or {}).get("clusterQueue") or ""
            view = cqs.get(cq_name)
            if view is None:
                misconfigured.append((wl, "Misconfigured", f"ClusterQueue {cq_name} doesn't exist"))
                continue
            stop = (view.obj.get("spec") or {}).get("stopPolicy") or "None"
            if stop != "None":
                misconfigured.append((wl, "Suspended", f"ClusterQueue {cq_name} is inactive"))
                continue
            view.pending.append(wl)
        for view in cqs.values():
            view.pending.sort(key=_queue_key)
        return cqs, misconfigured

    # --- visibility --------------------------------------------------------------

    def pending_workloads(self, cluster_queue: str | None = None, namespace: str | None = None,
                          local_queue: str | None = None) -> list[dict[str, Any]]:
        """PendingWorkload items (visibility API) of a ClusterQueue or a LocalQueue.

        With `local_queue` (and `namespace`): that LocalQueue's view; else the
        ClusterQueue's (all ClusterQueues when None).  Raises `UnknownQueue`
        when the named queue does not exist.
        """
        cqs, _ = self._snapshot()
        if local_queue is not None:
            lq = self.cache.get(LOCALQUEUES.plural, namespace or "default", local_queue)
            if lq is None:
                raise UnknownQueue(f'localqueues.kueue.x-k8s.io "{local_queue}" not found')
            cq_name = (lq.get("spec") or {}).get("clusterQueue") or ""
            names = [cq_name] if cq_name in cqs else []
        elif cluster_queue is not None:
            if cluster_queue not in cqs:
                raise UnknownQueue(f'clusterqueues.kueue.x-k8s.io "{cluster_queue}" not found')
            names = [cluster_queue]
        else:
            names = sorted(cqs)
        items: list[dict[str, Any]] = []
        for name in names:
            lq_pos: dict[tuple[str, str], int] = {}
            for pos, wl in enumerate(cqs[name].pending):
                md = wl["metadata"]
                lq_name = (wl.get("spec") or {}).get("queueName") or ""
                k = (md.get("namespace") or "", lq_name)
                lq_index = lq_pos.get(k, 0)
                lq_pos[k] = lq_index + 1
                if local_queue is not None and k != (namespace or "default", local_queue):
                    continue
                items.append({
                    "metadata": {
                        "name": md["name"],
                        "namespace": md.get("namespace"),
                        "creationTimestamp": md.get("creationTimestamp"),
                        "ownerReferences": [{k2: r[k2] for k2 in ("apiVersion", "kind", "name", "uid") if k2 in r}
                                            for r in md.get("ownerReferences") or ()],
                    },
                    "priority": workload_priority(wl),
                    "localQueueName": lq_name,
                    "positionInClusterQueue": pos,
                    "positionInLocalQueue": lq_index,
                })
        return items

    # --- one cycle ----------------------------------------------------------------

    def cycle(self) -> bool:
        """Try to admit pending workloads; returns True if another cycle should follow soon."""
        self.cycles += 1
        now = self.clock.now()
        cqs, misconfigured = self._snapshot()
        again = False
        for wl, reason, message in misconfigured:
            self._set_pending(wl, _reason(self.opts, reason), message, now)
        tree = _QuotaTree(cqs)
        flavors = {o["metadata"]["name"]: o for o in self.cache.list(RESOURCEFLAVORS.plural)}
        self._cycle_evicted = set()
        # Workloads that only fit by borrowing from the cohort wait until every
        # ClusterQueue of the cohort has admitted what fits in its own nominal quota
        # (kueue pkg/scheduler/scheduler.go: the cycle's entries are ordered with
        # "request under nominal quota before borrowing").
        deferred: list[tuple[_CQView, Obj]] = []
        for view in cqs.values():
            later = deferred if tree.cohort_of.get(view.name) else None
            if self._cycle_cq([(view, wl) for wl in view.pending], tree, flavors, now, later):
                again = True
        if deferred:
            # Second pass: the borrowing ones, across ClusterQueues, by priority then queue time.
            deferred.sort(key=lambda e: _queue_key(e[1]))
            if self._cycle_cq(deferred, tree, flavors, now, None):
                again = True
        if self._status_dirty and time.monotonic() - self._last_status_write >= self.opts.status_interval_wall:
            # Marked clean before a snapshot taken now, not the cycle's opening one: this cycle's own
            # admissions and evictions (and other threads' writes meanwhile) marked it dirty after that
            # snapshot, and a status written from it would stay stale until the next Workload change.
            self._status_dirty = False
            self._last_status_write = time.monotonic()
            self._write_queue_status(self._snapshot()[0])
        elif self._status_dirty and not self._status_timer:
            # One pending wake-up at a time: the status is written on the next cycle after it.
            self._status_timer = True
            self.clock.call_later(self.opts.status_interval_wall * self.clock.speed, self._status_wake)
        return again

    def _status_wake(self) -> None:
        self._status_timer = False
        self._wake.set()

    def _cycle_cq(self, pending: list[tuple[_CQView, Obj]], tree: _QuotaTree, flavors: dict[str, Obj], now: float,
                  later: list[tuple[_CQView, Obj]] | None) -> bool:
        """Admit, preempt for or mark pending each (ClusterQueue, Workload) of `pending` in order.

        With `later` (a ClusterQueue in a cohort, first pass), a Workload that fits
        only by borrowing is appended to `later` instead (and, under StrictFIFO,
        everything behind it) for the second pass.
        """
        blocked: set[str] = set()
        deferring: set[str] = set()
        admitted_any = False
        for view, wl in pending:
            strict = (view.obj.get("spec") or {}).get("queueingStrategy") == "StrictFIFO"
            if later is not None and view.name in deferring:
                later.append((view, wl))
                continue
            if view.name in blocked:
                self._set_pending(wl, _reason(self.opts, "WaitingForQuota"),
                                  "Workload is waiting for higher-priority workloads in a StrictFIFO ClusterQueue", now)
                continue
            assignment, failure, needs = self._assign(view, wl, tree, flavors)
            if assignment is not None:
                total: dict[FR, Fraction] = {}
                for psa in assignment:
                    for res, qty in psa["_usage"].items():
                        k = (psa["flavors"][res], res)
                        total[k] = total.get(k, Fraction(0)) + qty
                if later is not None and any(tree.used(view.name, k) + q > tree.nominal(view.name, k) for k, q in total.items()):
                    later.append((view, wl))
                    if strict:
                        deferring.add(view.name)
                    continue
                try:
                    self._admit(view, wl, assignment, now)
                except Exception as exc:
                    if api_code(exc) == 409:
                        return True
                    raise
                tree.add(view.name, total)
                admitted_any = True
                continue
            reason, message = failure
            if needs is not None:
                victims, waiting = self._preemption(view, wl, needs, tree)
                if victims or waiting:
                    for v, why, victim_cq in victims:
                        self._evict(v, wl, why, tree.path(view.name), tree.path(victim_cq), now)
                    n = len(victims) + waiting
                    reason = "WaitingForPreemptedWorkloads"
                    message = f"{message}. Pending the preemption of {n} workload(s)"
            self._set_pending(wl, _reason(self.opts, reason), message, now)
            if strict:
                blocked.add(view.name)
        return admitted_any

    def _assign(self, view: _CQView, wl: Obj, tree: _QuotaTree, flavors: dict[str, Obj]
                ) -> tuple[list[dict[str, Any]] | None, tuple[str, str], dict[FR, Fraction] | None]:
        """Flavor assignment against the quota the ClusterQueue can use (nominal, plus
        what it may borrow from its cohort).

        Returns (assignment, _, None) when the workload fits, else
        (None, (reason, message), needs) where `needs` is the total request per
        (flavor, resource) if preemption could make it fit, or None.  A flavor is
        a preemption target (kueue pkg/scheduler/flavorassigner/flavorassigner.go
        `fitsResourceQuota`) when the request is within the maximum capacity and
        either within the nominal quota or `borrowWithinCohort` allows preempting
        while borrowing.
        """
        cq = view.name
        spec = view.obj.get("spec") or {}
        groups = spec.get("resourceGroups") or []
        may_preempt_borrowing = ((spec.get("preemption") or {}).get("borrowWithinCohort") or {}).get("policy", "Never") not in ("Never", None) \
            and tree.cohort_of.get(cq) is not None
        templates = {ps.get("name"): ps.get("template") or {} for ps in (wl.get("spec") or {}).get("podSets") or []}
        extra: dict[FR, Fraction] = {}
        needs: dict[FR, Fraction] = {}
        out: list[dict[str, Any]] = []
        first_failure: tuple[str, str] | None = None
        preemptable = True
        for ps_name, count, reqs in podset_requests(wl):
            selector = ((templates.get(ps_name) or {}).get("spec") or {}).get("nodeSelector") or {}
            for res in reqs:
                if not any(res in (g.get("coveredResources") or []) for g in groups):
                    return None, ("NoMatchingFlavor", f"couldn't assign flavors to pod set {ps_name}: resource {res} unavailable in ClusterQueue"), None
            chosen: dict[str, str] = {}
            for group in groups:
                covered = [r for r in group.get("coveredResources") or [] if r in reqs]
                if not covered:
                    continue
                failure: tuple[str, str] | None = None
                preempt_flavor: str | None = None
                picked: str | None = None
                for fl in group.get("flavors") or []:
                    fname = fl.get("name") or ""
                    node_labels = ((flavors.get(fname) or {}).get("spec") or {}).get("nodeLabels") or {}
                    if any(k in node_labels and node_labels[k] != v for k, v in selector.items()):
                        failure = failure or ("NoMatchingFlavor", f"couldn't assign flavors to pod set {ps_name}: flavor {fname} doesn't match node affinity")
                        continue
                    exceeds, fits, preempt_ok = False, True, True
                    for res in covered:
                        k = (fname, res)
                        cap = tree.potential(cq, k)
                        val = extra.get(k, Fraction(0)) + reqs[res]
                        if val > cap:
                            exceeds, fits = True, False
                            failure = ("ExceedsMaxQuota", f"couldn't assign flavors to pod set {ps_name}: insufficient quota for {res} in flavor {fname}, "
                                       f"previously considered podsets requests ({format_quantity(extra.get(k, Fraction(0)), res)}) + "
                                       f"current podset request ({format_quantity(reqs[res], res)}) > maximum capacity ({format_quantity(cap, res)})")
                            break
                        available = tree.available(cq, k)
                        if val > available:
                            fits = False
                            failure = ("WaitingForQuota", f"couldn't assign flavors to pod set {ps_name}: insufficient unused quota for {res} in flavor {fname}, "
                                       f"{format_quantity(val - available, res)} more needed")
                            if val > tree.nominal(cq, k) and not may_preempt_borrowing:
                                preempt_ok = False
                    if fits:
                        picked = fname
                        break
                    if not exceeds and preempt_ok and preempt_flavor is None:
                        preempt_flavor = fname
                target = picked or preempt_flavor
                if picked is None:
                    first_failure = first_failure or failure or ("NoMatchingFlavor", f"couldn't assign flavors to pod set {ps_name}")
                    if preempt_flavor is None:
                        preemptable = False
                if target is not None:
                    for res in covered:
                        k = (target, res)
                        needs[k] = needs.get(k, Fraction(0)) + reqs[res]
                        if picked is not None:
                            chosen[res] = picked
                            extra[k] = extra.get(k, Fraction(0)) + reqs[res]
            if len(chosen) == len(reqs):
                out.append({"name": ps_name, "count": count, "flavors": {r: chosen[r] for r in sorted(reqs)},
                            "resourceUsage": {r: format_quantity(q, r) for r, q in sorted(reqs.items())},
                            "_usage": dict(reqs)})
        if first_failure is not None:
            return None, first_failure, (needs if preemptable and needs else None)
        return out, ("", ""), None

    def _preemption(self, view: _CQView, wl: Obj, needs: dict[FR, Fraction], tree: _QuotaTree
                    ) -> tuple[list[tuple[Obj, str, str]], int]:
        """Victims to evict so `wl` fits: [(victim, Preempted reason, its ClusterQueue)] and the
        number of already-evicted Workloads it waits for; ([], 0) when preemption cannot help.

        Classical preemption as kueue pkg/scheduler/preemption/preemption.go
        `classicalPreemptions` with the candidates of
        pkg/scheduler/preemption/classical/hierarchical_preemption.go and
        candidate_generator.go, for one level of cohort:

        * same ClusterQueue (`withinClusterQueue`): reason `InClusterQueue`;
        * other ClusterQueues of the cohort that are over their nominal quota in a
          resource the preemptor needs (`reclaimWithinCohort` must allow the
          candidate's priority): `InCohortReclamation` when the preemptor fits in its
          own nominal quota (it reclaims what was lent) or may not borrow while
          preempting; `InCohortReclaimWhileBorrowing` when `borrowWithinCohort` lets
          it preempt lower-priority Workloads (at most `maxPriorityThreshold`) and
          still borrow;
        * order: already evicted first, other ClusterQueues before the own one,
          lowest priority, most recently admitted; take until the Workload fits, then
          put back (newest first) the ones it does not need.
        """
        cq = view.name
        pre = (view.obj.get("spec") or {}).get("preemption") or {}
        within = pre.get("withinClusterQueue") or "Never"
        reclaim = pre.get("reclaimWithinCohort") or "Never"
        bwc = pre.get("borrowWithinCohort") or {}
        borrow_forbidden = (bwc.get("policy") or "Never") == "Never"
        threshold = bwc.get("maxPriorityThreshold")
        cohort = tree.cohort_of.get(cq)
        frs_need = {k for k, q in needs.items() if q > tree.available(cq, k)} or set(needs)
        prio = workload_priority(wl)
        wl_ts = _queue_key(wl)[1]

        def satisfies(v: Obj, policy: str) -> bool:  # kueue pkg/scheduler/preemption/common/preemption_policy.go
            p = workload_priority(v)
            if policy == "LowerPriority":
                return p < prio
            if policy == "LowerOrNewerEqualPriority":
                return p < prio or (p == prio and _queue_key(v)[1] > wl_ts)
            return policy == "Any"

        def evicted(v: Obj) -> bool:
            return condition_true(v, "Evicted") or (v["metadata"].get("uid") or "") in self._cycle_evicted

        def uses(v: Obj) -> bool:
            return any(k in frs_need for k in _admitted_usage(v))

        def fits(allow_borrowing: bool) -> bool:  # kueue preemption.go `workloadFits`
            for k, q in needs.items():
                if not allow_borrowing and tree.used(cq, k) + q > tree.nominal(cq, k):
                    return False
                if q > tree.available(cq, k):
                    return False
            return True

        def over_nominal(name: str) -> bool:
            return any(tree.borrowing(name, k) for k in frs_need)

        # Workloads already evicted and still releasing quota: wait for them when enough.
        releasing = [(v, cq) for v in view.admitted if evicted(v)]
        if cohort is not None:
            releasing += [(v, other) for other in tree.members[cohort] if other != cq
                          for v in tree.views[other].admitted if evicted(v) and uses(v)]
        if releasing:
            for v, name in releasing:
                tree.add(name, _admitted_usage(v), -1)
            enough = fits(True)
            for v, name in releasing:
                tree.add(name, _admitted_usage(v), 1)
            if enough:
                return [], len(releasing)

        # (workload, its ClusterQueue, reason, may be taken while the preemptor borrows)
        same: list[tuple[Obj, str, str, bool]] = []
        if within != "Never":
            same = [(v, cq, "InClusterQueue", True) for v in view.admitted if satisfies(v, within) and uses(v)]
        hierarchy: list[tuple[Obj, str, str, bool]] = []
        by_priority: list[tuple[Obj, str, str, bool]] = []
        if cohort is not None and reclaim != "Never":
            advantage = all(tree.used(cq, k) + q <= tree.nominal(cq, k) for k, q in needs.items())
            for other in tree.members[cohort]:
                if other == cq or not over_nominal(other):
                    continue
                for v in tree.views[other].admitted:
                    if not uses(v) or not satisfies(v, reclaim):
                        continue
                    if advantage:
                        hierarchy.append((v, other, "InCohortReclamation", True))
                        continue
                    p = workload_priority(v)
                    above = p >= prio or (threshold is not None and p > int(threshold))
                    if borrow_forbidden or above:
                        by_priority.append((v, other, "InCohortReclamation", False))
                    else:
                        by_priority.append((v, other, "InCohortReclaimWhileBorrowing", True))

        def admitted_at(v: Obj) -> float:
            return parse_time((find_condition(v, "QuotaReserved") or {}).get("lastTransitionTime")) or 0.0

        def order(c: tuple[Obj, str, str, bool]) -> tuple[int, float, int]:
            # kueue common/ordering.go `CandidatesOrdering` breaks ties by UID; the simulator
            # takes the most recently created first, so runs are repeatable.
            return (workload_priority(c[0]), -admitted_at(c[0]), -_creation_rv(c[0]))

        lists = [sorted(x, key=order) for x in (hierarchy, by_priority, same)]
        candidates = [c for x in lists for c in x if evicted(c[0])] + [c for x in lists for c in x if not evicted(c[0])]
        if not candidates:
            return [], 0
        under_nominal = all(tree.used(cq, k) < tree.nominal(cq, k) for k in frs_need)
        if not hierarchy and not by_priority or (borrow_forbidden and not under_nominal):
            attempts = [True]
        elif borrow_forbidden and not hierarchy:
            attempts = [False, True]
        else:
            attempts = [True, False]
        for allow_borrowing in attempts:
            targets: list[tuple[Obj, str, str, bool]] = []
            found = False
            for c in candidates:
                v, name, _reason_, while_borrowing = c
                if name != cq and ((allow_borrowing and not while_borrowing) or not over_nominal(name)):
                    continue
                tree.add(name, _admitted_usage(v), -1)
                targets.append(c)
                if fits(allow_borrowing):
                    found = True
                    break
            if found:
                for c in list(reversed(targets[:-1])):
                    tree.add(c[1], _admitted_usage(c[0]), 1)
                    if fits(allow_borrowing):
                        targets.remove(c)
                    else:
                        tree.add(c[1], _admitted_usage(c[0]), -1)
            for c in targets:
                tree.add(c[1], _admitted_usage(c[0]), 1)
            if found:
                victims = [(c[0], c[2], c[1]) for c in targets if not evicted(c[0])]
                return victims, len(targets) - len(victims)
        return [], 0

    # --- writes ---------------------------------------------------------------------

    def _admit(self, view: _CQView, wl: Obj, assignment: list[dict[str, Any]], now: float) -> None:
        new = status_copy(wl)
        st = new.setdefault("status", {})
        conds = st.setdefault("conditions", [])
        gen = wl["metadata"].get("generation")
        st["admission"] = {"clusterQueue": view.name,
                           "podSetAssignments": [{k: v for k, v in a.items() if not k.startswith("_")} for a in assignment]}
        set_condition(conds, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {view.name}", now, observed_generation=gen)
        checks = _cq_admission_checks(view.obj)
        if checks:
            # kueue pkg/workload/admissionchecks.go `SyncAdmittedCondition`: quota reserved but
            # checks pending -> Admitted=False/UnsatisfiedAdmissionChecks; the JobSet stays suspended.
            old_states = {c.get("name"): c for c in st.get("admissionChecks") or []}
            st["admissionChecks"] = [old_states.get(n) or {"name": n, "state": "Pending", "message": "",
                                                            "lastTransitionTime": format_time(now)} for n in checks]
            if not all(c.get("state") == "Ready" for c in st["admissionChecks"]):
                set_condition(conds, "Admitted", "False", "UnsatisfiedAdmissionChecks" if self.opts.granular_reasons else "UnsatisfiedChecks",
                              "The workload has not all admission checks", now, observed_generation=gen)
            else:
                set_condition(conds, "Admitted", "True", "Admitted", "The workload is admitted", now, observed_generation=gen)
        else:
            set_condition(conds, "Admitted", "True", "Admitted", "The workload is admitted", now, observed_generation=gen)
        for t in ("Evicted", "Preempted"):
            c = find_condition(conds, t)
            if c and c.get("status") == "True":
                set_condition(conds, t, "False", "QuotaReserved", f"Previously: {c.get('message') or ''}", now, observed_generation=gen)
        if st.get("requeueState"):
            st["requeueState"].pop("requeueAt", None)  # the count is kept across admissions
        st.pop("resourceRequests", None)
        created = parse_time(wl["metadata"].get("creationTimestamp")) or now
        out = self.ctx.update_status(WORKLOADS, new)
        self.ctx.event(out, WORKLOADS, "Normal", "QuotaReserved",
                       f"Quota reserved in ClusterQueue {view.name}, wait time since queued was {int(max(0, now - created))}s", COMPONENT_ADMISSION)
        if condition_true(out, "Admitted"):
            self.ctx.event(out, WORKLOADS, "Normal", "Admitted",
                           f"Admitted by ClusterQueue {view.name}, wait time since reservation was 0s", COMPONENT_ADMISSION)

    def _evict(self, victim: Obj, preemptor: Obj, reason: str, preemptor_path: str, preemptee_path: str, now: float) -> None:
        """Preempt `victim` (kueue pkg/scheduler/preemption/preemption.go `IssuePreemptions`,
        pkg/workload/evict/evict.go `Evict`): `Evicted=True/Preempted` and `Preempted=True/<reason>`
        with the upstream message, admission checks reset to Pending, the eviction counted, events
        `Preempted` and `EvictedDueToPreempted` on the victim, `PreemptedWorkload` on the preemptor."""
        pmd = preemptor["metadata"]
        owner: dict[str, Any] = next((r for r in pmd.get("ownerReferences") or () if r.get("controller")), {})
        job_uid = (pmd.get("labels") or {}).get(JOB_UID_LABEL) or owner.get("uid") or "UNKNOWN"
        why = _PREEMPTION_REASONS.get(reason, "UNKNOWN")
        message = (f"Preempted to accommodate a workload (UID: {pmd.get('uid') or 'UNKNOWN'}, JobUID: {job_uid}) "
                   f"due to {why}; preemptor path: {preemptor_path}; preemptee path: {preemptee_path}")
        new = status_copy(victim)
        st = new.setdefault("status", {})
        conds = st.setdefault("conditions", [])
        gen = victim["metadata"].get("generation")
        set_condition(conds, "Evicted", "True", "Preempted", message, now, observed_generation=gen)
        set_condition(conds, "Preempted", "True", reason, message, now)
        _reset_checks(st, now)
        _count_eviction(st, "Preempted", "")  # evict.Evict is called with no underlying cause
        out = self.ctx.update_status(WORKLOADS, new)
        self._cycle_evicted.add(victim["metadata"].get("uid") or "")
        pv, pp = workload_priority(victim), workload_priority(preemptor)
        prios = (f"; preemptor effective priority: {pp} (base: {pp}, boost: 0); "
                 f"preemptee effective priority: {pv} (base: {pv}, boost: 0)")
        self.ctx.event(out, WORKLOADS, "Normal", "EvictedDueToPreempted", message, COMPONENT_ADMISSION)
        self.ctx.event(out, WORKLOADS, "Normal", "Preempted", message + prios, COMPONENT_ADMISSION)
        vmd = victim["metadata"]
        cq = ((victim.get("status") or {}).get("admission") or {}).get("clusterQueue") or ""
        self.ctx.event(preemptor, WORKLOADS, "Normal", "PreemptedWorkload",
                       f"Preempted workload {vmd.get('namespace')}/{vmd['name']} (UID: {vmd.get('uid')}) in ClusterQueue {cq}{prios}",
                       COMPONENT_ADMISSION)

    def _set_pending(self, wl: Obj, reason: str, message: str, now: float) -> None:
        cur = find_condition(wl, "QuotaReserved")
        # podSets are immutable: compute the requests once, not on every scheduling cycle.
        requests = (wl.get("status") or {}).get("resourceRequests") or _resource_requests(wl)
        if cur is not None and cur.get("status") == "False" and cur.get("reason") == reason and \
                re.sub(r"\d+", "#", cur.get("message") or "") == re.sub(r"\d+", "#", message) and \
                find_condition(wl, "Admitted") is not None and (wl.get("status") or {}).get("resourceRequests") == requests:
            return  # same verdict; don't rewrite for changed numbers only
        new = status_copy(wl)
        st = new.setdefault("status", {})
        conds = st.setdefault("conditions", [])
        gen = wl["metadata"].get("generation")
        set_condition(conds, "QuotaReserved", "False", reason, message, now, observed_generation=gen)
        # kueue pkg/scheduler/scheduler.go `requeueAndUpdate` (UnsetQuotaReservationWithCondition,
        # PropagateResourceRequests): Admitted=False/NoReservation and status.resourceRequests.
        set_condition(conds, "Admitted", "False", "NoReservation", "The workload has no reservation", now, observed_generation=gen)
        st["resourceRequests"] = requests
        try:
            out = self.ctx.update_status(WORKLOADS, new)
        except Exception as exc:
            if api_code(exc) in (404, 409):
                self._wake.set()
                return
            raise
        self.ctx.event(out, WORKLOADS, "Warning", "Pending", message, COMPONENT_ADMISSION)

    def _write_queue_status(self, cqs: dict[str, _CQView]) -> None:
        now = self.clock.now()
        lq_counts: dict[tuple[str, str], dict[str, Any]] = {}
        for view in cqs.values():
            for wl in view.pending:
                k = (wl["metadata"].get("namespace") or "", (wl.get("spec") or {}).get("queueName") or "")
                lq_counts.setdefault(k, {"pending": 0, "reserving": 0, "admitted": 0, "usage": {}})["pending"] += 1
            for wl in view.admitted:
                k = (wl["metadata"].get("namespace") or "", (wl.get("spec") or {}).get("queueName") or "")
                entry = lq_counts.setdefault(k, {"pending": 0, "reserving": 0, "admitted": 0, "usage": {}})
                entry["reserving"] += 1
                if condition_true(wl, "Admitted"):
                    entry["admitted"] += 1
                for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
                    for res, qty in (psa.get("resourceUsage") or {}).items():
                        fk = ((psa.get("flavors") or {}).get(res) or "", res)
                        entry["usage"][fk] = entry["usage"].get(fk, Fraction(0)) + parse_quantity(qty)
            self._write_cq_status(view, now)
        for lq in self.cache.list(LOCALQUEUES.plural):
            md = lq["metadata"]
            entry = lq_counts.get((md.get("namespace") or "", md["name"]), {"pending": 0, "reserving": 0, "admitted": 0, "usage": {}})
            cq_name = (lq.get("spec") or {}).get("clusterQueue") or ""
            exists = cq_name in cqs
            st = clone(lq.get("status") or {})
            st["pendingWorkloads"] = entry["pending"]
            st["reservingWorkloads"] = entry["reserving"]
            st["admittedWorkloads"] = entry["admitted"]
            usage = _usage_list(entry["usage"], cqs[cq_name] if exists else None, with_borrowed=False)
            st["flavorsReservation"] = usage
            st["flavorsUsage"] = usage  # v1beta2 name; v1beta1 readers see flavorUsage
            st.pop("flavorUsage", None)
            conds = st.setdefault("conditions", [])
            if exists:
                set_condition(conds, "Active", "True", "Ready", "Can submit new workloads to localQueue", now,
                              observed_generation=md.get("generation"))
            else:
                set_condition(conds, "Active", "False", "ClusterQueueDoesNotExist", "Can't submit new workloads to clusterQueue", now,
                              observed_generation=md.get("generation"))
            self._write_status(LOCALQUEUES, lq, st)

    def _write_cq_status(self, view: _CQView, now: float) -> None:
        cq = view.obj
        st = clone(cq.get("status") or {})
        st["pendingWorkloads"] = len(view.pending)
        st["reservingWorkloads"] = view.reserving
        st["admittedWorkloads"] = view.admitted_count
        usage = _usage_list(view.usage, view, with_borrowed=True)
        st["flavorsReservation"] = usage
        st["flavorsUsage"] = usage
        conds = st.setdefault("conditions", [])
        stop = (cq.get("spec") or {}).get("stopPolicy") or "None"
        if stop == "None":
            set_condition(conds, "Active", "True", "Ready", "Can admit new workloads", now,
                          observed_generation=cq["metadata"].get("generation"))
        else:
            set_condition(conds, "Active", "False", "Stopped", "The ClusterQueue is stopped", now,
                          observed_generation=cq["metadata"].get("generation"))
        self._write_status(CLUSTERQUEUES, cq, st)

    def _write_status(self, rt: Any, obj: Obj, status: dict[str, Any]) -> None:
        if status == obj.get("status"):
            return
        new = {**obj, "status": status}
        try:
            self.ctx.update_status(rt, new)
        except Exception as exc:
            if api_code(exc) in (404, 409):
                self._status_dirty = True
                self._wake.set()
                return
            raise


def _usage_list(usage: dict[tuple[str, str], Fraction], view: _CQView | None, with_borrowed: bool) -> list[dict[str, Any]]:
    """`[{name: flavor, resources: [{name, total[, borrowed]}]}]` in the ClusterQueue's flavor order
    (`borrowed`: what the ClusterQueue uses past its nominal quota, from its cohort)."""
    order: list[tuple[str, list[str]]] = []
    if view is not None:
        for group in (view.obj.get("spec") or {}).get("resourceGroups") or []:
            for fl in group.get("flavors") or []:
                order.append((fl.get("name") or "", [r.get("name") for r in fl.get("resources") or []]))
    nominal = view.nominal() if view is not None and with_borrowed else {}
    out = []
    for fname, resources in order:
        entries = []
        for res in resources:
            used = usage.get((fname, res), Fraction(0))
            e: dict[str, Any] = {"name": res, "total": format_quantity(used, res)}
            if with_borrowed:
                # kueue apis/kueue/v1beta2/clusterqueue_types.go `borrowed`: usage past the nominal quota.
                e["borrowed"] = format_quantity(max(Fraction(0), used - nominal.get((fname, res), Fraction(0))), res)
            entries.append(e)
        out.append({"name": fname, "resources": entries})
    return out
