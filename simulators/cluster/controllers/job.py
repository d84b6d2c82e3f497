"""Stand-in for the Kubernetes batch/v1 Job controller inside the simulator.

Reconciles each Job (key: namespace, name) from its Pods, found through the
owner-UID index of the informer cache: creates Pods up to `parallelism` for
the completions still missing (Indexed: one per index, named
`<job>-<index>-<random>`), counts `active` / `ready` / `succeeded` / `failed`,
applies `backoffLimit` (failed pods, plus container restarts for
`restartPolicy: OnFailure`) and `activeDeadlineSeconds`, sets the `Complete`
/ `Failed` / `Suspended` conditions and deletes the active Pods of suspended
or finished Jobs.  Started by `simulators.cluster.controllers.start_controllers`;
the JobSet controller (`simulators.cluster.controllers.jobset`) reads the Job
status this writes.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Hashable, Iterable, cast

from simulators.cluster.clock import format_time, parse_time
from simulators.cluster.controllers.runtime import (
    controller_owner_name,
    JOBS,
    Key,
    PODS,
    Controller,
    ControllerContext,
    Obj,
    clone,
    condition_true,
    controller_owner_uid,
    find_condition,
    is_deleting,
    owner_reference,
    set_condition,
)

COMPONENT = "job-controller"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Pod re-creation back-off after failures (kubernetes pkg/controller/job/job_controller.go:
# DefaultJobPodFailureBackOff 10 s, doubling, MaxJobPodFailureBackOff 10 min).
POD_BACKOFF_BASE = 10.0
POD_BACKOFF_CAP = 600.0


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(_ALPHABET) for _ in range(n))


def pod_index(pod: Obj) -> int | None:
    md = pod.get("metadata") or {}
    raw = (md.get("annotations") or {}).get(INDEX_KEY) or (md.get("labels") or {}).get(INDEX_KEY)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def pod_is_ready(pod: Obj) -> bool:
    return condition_true(pod, "Ready")


def pod_phase(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def parse_indexes(text: str | None) -> set[int]:
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return out


def format_indexes(indexes: Iterable[int]) -> str:
    """`{0,1,2,4}` -> "0-2,4" (the Job API's compressed interval list)."""
    items = sorted(set(indexes))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


def job_spec_numbers(job: Obj) -> tuple[int, int | None, bool, int]:
    """(parallelism, completions, indexed, backoffLimit) with API defaults."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism")
    completions = spec.get("completions")
    indexed = spec.get("completionMode") == "Indexed"
    if parallelism is None:
        parallelism = 1
    if completions is None and indexed:
        completions = parallelism  # lenient: the real API rejects Indexed without completions
    if completions is None and spec.get("parallelism") is None:
        completions = 1
    backoff_limit = spec.get("backoffLimit")
    if backoff_limit is None:
        backoff_limit = 6
    return int(parallelism), (None if completions is None else int(completions)), indexed, int(backoff_limit)


def restart_count(pod: Obj) -> int:
    st = pod.get("status") or {}
    return sum(int(c.get("restartCount") or 0) for c in (st.get("containerStatuses") or []) + (st.get("initContainerStatuses") or []))


def pod_finished_at(pod: Obj) -> float | None:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (c.get("state") or {}).get("terminated")
        if term and term.get("finishedAt"):
            return parse_time(term["finishedAt"])
    return None


class JobController(Controller):
    name = "job"
    workers = 2

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self._lock = threading.Lock()
        # Failure accounting (the real controller uses the pod finalizer
        # batch.kubernetes.io/job-tracking and status.uncountedTerminatedPods):
        # pods this controller deleted itself without counting them (suspend,
        # scale-down), failed pods already in status.failed per Job UID, and
        # pods that vanished before a reconcile could count them.
        self._uncounted_deletes: set[str] = set()
        self._counted: dict[str, set[str]] = {}
        self._gone: dict[str, dict[str, float]] = {}
        self._last_failure: dict[str, float] = {}
        self.cache.add_handler(JOBS.plural, self._on_job)
        self.cache.add_handler(PODS.plural, self._on_pod)

    def _on_job(self, event: str, obj: Obj, old: Obj | None) -> None:
        md = obj["metadata"]
        if event == "DELETED":
            with self._lock:
                uid = md.get("uid") or ""
                self._counted.pop(uid, None)
                self._gone.pop(uid, None)
                self._last_failure.pop(uid, None)
        if self.is_own(event, obj):
            return
        self.queue.add((md.get("namespace") or "", md["name"]))

    def _on_pod(self, event: str, obj: Obj, old: Obj | None) -> None:
        owner = controller_owner_name(obj, "Job")
        if owner is None:
            return
        if event == "DELETED":
            uid = obj["metadata"].get("uid") or ""
            job_uid = controller_owner_uid(obj) or ""
            with self._lock:
                if uid in self._uncounted_deletes:
                    self._uncounted_deletes.discard(uid)
                elif pod_phase(obj) != "Succeeded" and uid not in self._counted.get(job_uid, ()):
                    # Gone before a reconcile counted it: still a failure (isPodFailed).
                    self._gone.setdefault(job_uid, {})[uid] = self.clock.now()
        self.queue.add((obj["metadata"].get("namespace") or "", owner))

    def _is_failed(self, pod: Obj) -> bool:
        """kubernetes pkg/controller/job/job_controller.go `isPodFailed` (no podFailurePolicy):
        phase Failed, or deleted (deletionTimestamp) and not Succeeded -- unless
        this controller deleted it itself for a suspend or scale-down, which
        removes the tracking finalizer first (`deleteJobPods`) so it is never counted."""
        if (pod["metadata"].get("uid") or "") in self._uncounted_deletes:
            return False  # its Failed phase (SIGTERM, exit 143) after the deletion is not counted either
        phase = pod_phase(pod)
        if phase == "Failed":
            return True
        return is_deleting(pod) and phase != "Succeeded"

    def resync_keys(self) -> Iterable[Hashable]:
        return self.cache.keys(JOBS.plural)

    # --- reconcile --------------------------------------------------------------

    def reconcile(self, key: Hashable) -> float | None:
        ns, name = cast(Key, key)
        job = self.cache.get(JOBS.plural, ns, name)
        if job is None or is_deleting(job):
            return None
        uid = job["metadata"]["uid"]
        now = self.clock.now()
        spec = job.get("spec") or {}
        parallelism, completions, indexed, backoff_limit = job_spec_numbers(job)
        pods = [p for p in self.cache.owned(PODS.plural, uid) if controller_owner_uid(p) == uid]
        live = [p for p in pods if not is_deleting(p)]
        active = [p for p in live if pod_phase(p) not in ("Succeeded", "Failed")]
        terminating = [p for p in pods if is_deleting(p) and pod_phase(p) not in ("Succeeded", "Failed")]
        succeeded_pods = [p for p in pods if pod_phase(p) == "Succeeded"]

        old_status = job.get("status") or {}
        status: dict[str, Any] = clone(old_status)
        conds: list[dict[str, Any]] = status.setdefault("conditions", [])
        events: list[tuple[str, str, str]] = []

        if indexed:
            done = parse_indexes(old_status.get("completedIndexes"))
            done.update(i for i in (pod_index(p) for p in succeeded_pods) if i is not None and (completions is None or i < completions))
            succeeded = len(done)
            if done:
                status["completedIndexes"] = format_indexes(done)
        else:
            done = set()
            succeeded = max(int(old_status.get("succeeded") or 0), len(succeeded_pods))

        # Failed pods, counted once each (see _is_failed); deleted pods count too.
        old_failed = int(old_status.get("failed") or 0)
        with self._lock:
            failed_now = [p for p in pods if self._is_failed(p)]
            counted = self._counted.get(uid)
            if counted is None:
                # First look at this Job (e.g. after a restart): what is there is already in status.failed.
                seed = sorted(failed_now, key=lambda p: p["metadata"]["name"])[:old_failed]
                counted = {p["metadata"]["uid"] for p in seed}
                self._counted[uid] = counted
            gone = dict(self._gone.get(uid) or {})
        new_failures = [p for p in failed_now if p["metadata"]["uid"] not in counted]
        new_gone = {u: t for u, t in gone.items() if u not in counted}
        failed = old_failed + len(new_failures) + len(new_gone)
        last_failure = self._last_failure.get(uid, 0.0)
        for p in new_failures:
            last_failure = max(last_failure, pod_finished_at(p) or parse_time((p["metadata"] or {}).get("deletionTimestamp")) or now)
        for t in new_gone.values():
            last_failure = max(last_failure, t)
        if not new_failures and not new_gone and uid not in self._last_failure:
            last_failure = max([last_failure] + [pod_finished_at(p) or 0.0 for p in failed_now])

        restart_policy = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy") or "Never"
        # kubernetes job_controller.go `pastBackoffLimitOnFailure`: container restarts of
        # Pending/Running pods, `> 0` for backoffLimit 0, else `>= backoffLimit`.
        restarts = sum(restart_count(p) for p in active) if restart_policy == "OnFailure" else 0
        past_on_failure = restart_policy == "OnFailure" and (restarts > 0 if backoff_limit == 0 else restarts >= backoff_limit)

        finished = condition_true(job, "Complete") or condition_true(job, "Failed")
        target = find_condition(job, "FailureTarget")
        met = find_condition(job, "SuccessCriteriaMet")
        suspended = bool(spec.get("suspend"))
        requeue: float | None = None
        to_delete: list[Obj] = []
        uncounted_delete: list[Obj] = []
        to_create: list[int | None] = []

        if finished:
            to_delete = active
        elif target is not None and target.get("status") == "True" or met is not None and met.get("status") == "True":
            # kubernetes job_controller.go: the interim FailureTarget / SuccessCriteriaMet
            # condition first; Failed / Complete only once no pod is terminating
            # (`enactJobFinished`, delayTerminalCondition).  Remaining pods count as failed.
            interim = target if target is not None and target.get("status") == "True" else met
            assert interim is not None
            to_delete = active
            if not active and not terminating:
                self._finish(job, conds, status, interim, now, events)
        elif suspended:
            uncounted_delete = active
            if set_condition(conds, "Suspended", "True", "JobSuspended", "Job suspended", now):
                events.append(("Normal", "Suspended", "Job suspended"))
        else:
            if condition_true(job, "Suspended"):
                set_condition(conds, "Suspended", "False", "JobResumed", "Job resumed", now)
                events.append(("Normal", "Resumed", "Job resumed"))
                status["startTime"] = format_time(now)
            if not status.get("startTime"):
                status["startTime"] = format_time(now)
            start = parse_time(status["startTime"]) or now
            deadline = spec.get("activeDeadlineSeconds")
            failure: tuple[str, str] | None = None
            if failed > backoff_limit or past_on_failure:
                failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            elif deadline is not None and now >= start + float(deadline):
                failure = ("DeadlineExceeded", "Job was active longer than specified deadline")
            elif deadline is not None:
                requeue = start + float(deadline) - now
            complete = False
            if failure is None:
                if completions is not None:
                    complete = succeeded >= completions and not active
                else:
                    complete = succeeded > 0 and not active
            if failure is not None:
                set_condition(conds, "FailureTarget", "True", failure[0], failure[1], now, extra={"lastProbeTime": format_time(now)})
                to_delete = active
            elif complete:
                set_condition(conds, "SuccessCriteriaMet", "True", "CompletionsReached", "Reached expected number of succeeded pods", now,
                              extra={"lastProbeTime": format_time(now)})
            else:
                wait = self._pod_backoff(last_failure, failed, now) if failed else 0.0
                if wait > 0:
                    requeue = wait if requeue is None else min(requeue, wait)
                else:
                    to_create = self._missing(active, done, parallelism, completions, succeeded, indexed)

        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if pod_is_ready(p))
        status["succeeded"] = succeeded
        status["failed"] = failed
        status["terminating"] = len(terminating)
        status.setdefault("uncountedTerminatedPods", {})
        if not conds:
            status.pop("conditions")

        if status != old_status:
            job = self.update_own_status(JOBS, {**job, "status": status})
        with self._lock:
            counted.update(p["metadata"]["uid"] for p in new_failures)
            counted.update(new_gone)
            if uid in self._gone:
                for u in new_gone:
                    self._gone[uid].pop(u, None)
            if last_failure:
                self._last_failure[uid] = last_failure
        # The interim condition is written first; the terminal one follows in a second write.
        fresh_target = find_condition(job, "FailureTarget") or find_condition(job, "SuccessCriteriaMet")
        if fresh_target is not None and fresh_target.get("status") == "True" and not finished \
                and not condition_true(job, "Complete") and not condition_true(job, "Failed") and not active and not terminating:
            status2 = clone(job.get("status") or {})
            conds2 = status2.setdefault("conditions", [])
            self._finish(job, conds2, status2, fresh_target, now, events)
            job = self.update_own_status(JOBS, {**job, "status": status2})
        for etype, reason, msg in events:
            self.ctx.event(job, JOBS, etype, reason, msg, COMPONENT)
        if uncounted_delete:
            with self._lock:
                self._uncounted_deletes.update(p["metadata"]["uid"] for p in uncounted_delete)
        for pod in to_delete + uncounted_delete:
            if self.ctx.delete(PODS, ns, pod["metadata"]["name"], uid=pod["metadata"]["uid"]):
                self.ctx.event(job, JOBS, "Normal", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}", COMPONENT)
        for idx in to_create:
            pod = self.ctx.create(PODS, build_pod(job, idx))
            self.ctx.event(job, JOBS, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}", COMPONENT)
        return requeue

    @staticmethod
    def _finish(job: Obj, conds: list[dict[str, Any]], status: dict[str, Any], interim: dict[str, Any], now: float,
                events: list[tuple[str, str, str]]) -> None:
        """The terminal condition that follows an interim one (same reason and message)."""
        if condition_true(job, "Complete") or condition_true(job, "Failed"):
            return
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds):
            return
        reason, message = interim.get("reason") or "", interim.get("message") or ""
        if interim.get("type") == "SuccessCriteriaMet":
            set_condition(conds, "Complete", "True", reason, message, now, extra={"lastProbeTime": format_time(now)})
            status["completionTime"] = format_time(now)
            events.append(("Normal", "Completed", "Job completed"))
        else:
            set_condition(conds, "Failed", "True", reason, message, now, extra={"lastProbeTime": format_time(now)})
            events.append(("Warning", reason, message))

    @staticmethod
    def _pod_backoff(last_failure: float, failed: int, now: float) -> float:
        if not last_failure:
            return 0.0
        delay = min(POD_BACKOFF_CAP, POD_BACKOFF_BASE * 2.0 ** max(0, failed - 1))
        return max(0.0, last_failure + delay - now)

    @staticmethod
    def _missing(active: list[Obj], done: set[int], parallelism: int, completions: int | None,
                 succeeded: int, indexed: bool) -> list[int | None]:
        slots = parallelism - len(active)
        if slots <= 0:
            return []
        if indexed:
            busy = {pod_index(p) for p in active}
            missing: list[int | None] = [i for i in range(completions or 0) if i not in done and i not in busy]
            return missing[:slots]
        if completions is None:
            return [None] * slots if succeeded == 0 else []
        remaining = completions - succeeded - len(active)
        return [None] * max(0, min(slots, remaining))


def build_pod(job: Obj, index: int | None) -> Obj:
    """The Pod the Job controller creates for `index` (None for NonIndexed Jobs)."""
    jmd = job["metadata"]
    tmpl = (job.get("spec") or {}).get("template") or {}
    tmd = tmpl.get("metadata") or {}
    job_name, uid = jmd["name"], jmd["uid"]
    name = f"{job_name}-{index}-{random_suffix()}" if index is not None else f"{job_name}-{random_suffix()}"
    labels = dict(tmd.get("labels") or {})
    labels.update({
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": job_name,
        "controller-uid": uid,
        "job-name": job_name,
    })
    annotations = dict(tmd.get("annotations") or {})
    spec = clone(tmpl.get("spec") or {})
    if index is not None:
        labels[INDEX_KEY] = str(index)
        annotations[INDEX_KEY] = str(index)
        spec.setdefault("hostname", f"{job_name}-{index}")
        for c in spec.get("containers") or []:
            env = c.setdefault("env", [])
            if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                    "fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}})
    spec.setdefault("restartPolicy", "Never")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("serviceAccountName", "default")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": jmd.get("namespace") or "default",
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job, JOBS)],
            "finalizers": [],
        },
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": qos_class(spec)},
    }


def qos_class(spec: dict[str, Any]) -> str:
    containers = spec.get("containers") or []
    any_set = False
    guaranteed = bool(containers)
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and req[r] != lim[r]):
                guaranteed = False
    if guaranteed and any_set:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"
