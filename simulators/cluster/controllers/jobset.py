"""JobSet controller (jobset.x-k8s.io/v1alpha2) and the JobSet webhooks, simulated.

`JobSetController` follows the order of one reconcile of the real controller
(upstream kubernetes-sigs/jobset ``pkg/controllers/jobset_controller.go``): list the child Jobs through the owner-UID
index, classify them (previous restart attempt / failed / succeeded /
active), recompute `status.replicatedJobsStatus` from child Job status only,
handle a finished JobSet (delete active children, `ttlSecondsAfterFinished`),
delete previous-attempt Jobs (foreground), run the failure policy (restarts,
`maxRestarts`, rules) or the success policy (All/Any, targets), create the
missing `<jobset>-<rjob>-<index>` Jobs with the real labels/annotations and a
controller ownerReference (respecting `dependsOn` and `BlockingRecreate`),
suspend or resume child Jobs, and write the whole status in one update
(409 -> requeue).  Condition events are emitted after the write succeeds.

`jobset_admission` is registered with `Store.add_admission_hook` by
`simulators.cluster.controllers.start_controllers`: it applies the JobSet
defaulting webhook on CREATE and the JobSet validating webhook (immutable
spec fields) on UPDATE.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Hashable, Iterable, cast

from simulators.cluster.clock import parse_time
from simulators.cluster.controllers.runtime import (
    controller_owner_name,
    JOBS,
    Key,
    JOBSETS,
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

COMPONENT = "jobset-controller"
MANAGED_BY = "jobset.sigs.k8s.io/jobset-controller"
P = "jobset.sigs.k8s.io/"
JOBSET_NAME = P + "jobset-name"
JOBSET_UID = P + "jobset-uid"
RJOB_NAME = P + "replicatedjob-name"
RJOB_REPLICAS = P + "replicatedjob-replicas"
GLOBAL_REPLICAS = P + "global-replicas"
JOB_INDEX = P + "job-index"
JOB_GLOBAL_INDEX = P + "job-global-index"
JOB_KEY = P + "job-key"
RESTART_ATTEMPT = P + "restart-attempt"
GROUP_NAME = P + "group-name"
GROUP_REPLICAS = P + "group-replicas"
JOB_GROUP_INDEX = P + "job-group-index"
COORDINATOR = P + "coordinator"
PROPAGATED_ANNOTATIONS = ("alpha.jobset.sigs.k8s.io/exclusive-topology", "alpha.jobset.sigs.k8s.io/node-selector")
SCHEDULING_FIELDS = ("nodeSelector", "tolerations", "schedulingGates")

RESTART_ACTIONS = ("RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts", "RestartJob", "RestartJobAndIgnoreMaxRestarts")


# --- webhooks ---------------------------------------------------------------------


def default_jobset(obj: Obj) -> None:
    """The JobSet mutating webhook (reference 1.3), in place."""
    spec = obj.setdefault("spec", {})
    if spec.get("successPolicy") is None:
        spec["successPolicy"] = {"operator": "All"}
    spec["successPolicy"].setdefault("targetReplicatedJobs", [])
    if spec.get("startupPolicy") is None:
        spec["startupPolicy"] = {"startupPolicyOrder": "AnyOrder"}
    network = spec.get("network")
    if network is None:
        network = spec["network"] = {}
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for rjob in spec.get("replicatedJobs") or []:
        rjob.setdefault("groupName", "default")
        rjob.setdefault("replicas", 1)
        jspec = rjob.setdefault("template", {}).setdefault("spec", {})
        jspec.setdefault("completionMode", "Indexed")
        pspec = jspec.setdefault("template", {}).setdefault("spec", {})
        if not pspec.get("restartPolicy"):
            pspec["restartPolicy"] = "OnFailure"
    fp = spec.get("failurePolicy")
    if fp is not None:
        fp.setdefault("restartStrategy", "Recreate")
        for i, rule in enumerate(fp.get("rules") or []):
            if not rule.get("name"):
                rule["name"] = f"failurePolicyRule{i}"
    for vcp in spec.get("volumeClaimPolicies") or []:
        vcp.setdefault("retentionPolicy", {}).setdefault("whenDeleted", "Delete")


def _strip_scheduling(rjobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = clone(rjobs)
    for rjob in out:
        tmpl = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
        md = tmpl.get("metadata") or {}
        md.pop("labels", None)
        md.pop("annotations", None)
        if "metadata" in tmpl and not md:
            del tmpl["metadata"]
        for f in SCHEDULING_FIELDS:
            (tmpl.get("spec") or {}).pop(f, None)
    return out


_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded",
                        "PodFailurePolicy")
_FAILURE_ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts", "RestartJob",
                    "RestartJobAndIgnoreMaxRestarts")


def _validate_failure_policy(spec: dict[str, Any], names: list[str], restart_job_gate: bool) -> list[str]:
    """jobset pkg/webhooks/jobset_webhook.go `validateFailurePolicy` (and the RestartJob gate check)."""
    errors: list[str] = []
    fp = spec.get("failurePolicy") or {}
    rules = fp.get("rules") or []
    seen: set[str] = set()
    restart_job = False
    for i, rule in enumerate(rules):
        path = f"spec.failurePolicy.rules[{i}]"
        name = str(rule.get("name") or "")
        if name in seen:
            errors.append(f"{path}.name: Duplicate value: \"{name}\"")
        seen.add(name)
        if len(name) > 128 or not _RULE_NAME.match(name):
            errors.append(f"{path}.name: Invalid value: \"{name}\": rule names must match {_RULE_NAME.pattern} (at most 128 characters)")
        action = rule.get("action")
        if action not in _FAILURE_ACTIONS:
            errors.append(f"{path}.action: Unsupported value: \"{action}\": supported values: "
                          + ", ".join(f'"{a}"' for a in _FAILURE_ACTIONS))
        restart_job = restart_job or action in ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                errors.append(f"{path}.targetReplicatedJobs: Invalid value: \"{target}\": must name a replicated job")
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in _JOB_FAILURE_REASONS:
                errors.append(f"{path}.onJobFailureReasons: Unsupported value: \"{reason}\": supported values: "
                              + ", ".join(f'"{r}"' for r in _JOB_FAILURE_REASONS))
        for pattern in rule.get("onJobFailureMessagePatterns") or []:
            try:
                re.compile(str(pattern))
            except re.error as exc:
                errors.append(f"{path}.onJobFailureMessagePatterns: Invalid value: \"{pattern}\": {exc}")
    if restart_job and not restart_job_gate:
        errors.append("spec.failurePolicy.rules: Forbidden: RestartJob and RestartJobAndIgnoreMaxRestarts failure policy "
                      "actions are not allowed when RestartJob feature gate is disabled")
    elif restart_job and any(int(r.get("replicas", 1)) > 1024 for r in spec.get("replicatedJobs") or []):
        errors.append("spec.failurePolicy.rules: Invalid value: JobSet cannot have a failure policy rule with RestartJob or "
                      "RestartJobAndIgnoreMaxRestarts action and a replicated job with replicas > 1024")
    return errors


def _validate_coordinator(name: str, spec: dict[str, Any]) -> list[str]:
    """jobset pkg/webhooks/jobset_webhook.go `validateCoordinator`."""
    coord = spec.get("coordinator")
    if not coord:
        return []
    rname = coord.get("replicatedJob")
    rjob = next((r for r in spec.get("replicatedJobs") or [] if r.get("name") == rname), None)
    if rjob is None:
        return [f"spec.coordinator.replicatedJob: Invalid value: coordinator replicatedJob {rname} does not exist"]
    jspec = (rjob.get("template") or {}).get("spec") or {}
    if jspec.get("completionMode") != "Indexed" or jspec.get("completions") is None:
        return ["spec.coordinator: Invalid value: job for coordinator pod must be indexed completion mode, and completions number must be set"]
    job_index, pod_index = int(coord.get("jobIndex") or 0), int(coord.get("podIndex") or 0)
    errors = []
    if job_index >= int(rjob.get("replicas", 1)):
        errors.append(f"spec.coordinator.jobIndex: Invalid value: coordinator job index {job_index} is invalid for replicatedJob {rname}")
    elif pod_index >= int(jspec["completions"]):
        errors.append(f"spec.coordinator.podIndex: Invalid value: coordinator pod index {pod_index} is invalid for "
                      f"replicatedJob {rname} job index {job_index}")
    subdomain = (spec.get("network") or {}).get("subdomain") or name
    if len(f"{name}-{rname}-{job_index}-{pod_index}.{subdomain}") > 63:
        errors.append("spec.coordinator: Invalid value: spec will lead to invalid label value")
    return errors


def validate_jobset_create(obj: Obj, restart_job_gate: bool = False) -> list[str]:
    """Field errors of the JobSet validating webhook on CREATE (reference 1.2), "field: message".

    `restart_job_gate`: the JobSet `RestartJob` feature gate (alpha, off by default).
    """
    errors: list[str] = []
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec") or {}
    rjobs = spec.get("replicatedJobs") or []
    if not rjobs:
        errors.append("spec.replicatedJobs: Required value: at least one replicated job is required")
    names = [str(r.get("name") or "") for r in rjobs]
    for i, rjob in enumerate(rjobs):
        rname = names[i]
        path = f"spec.replicatedJobs[{i}]"
        if not rname:
            errors.append(f"{path}.name: Required value")
            continue
        if names.count(rname) > 1:
            errors.append(f"{path}.name: Duplicate value: \"{rname}\"")
        replicas = int(rjob.get("replicas", 1))
        if replicas < 0:
            errors.append(f"{path}.replicas: Invalid value: {replicas}: must be greater than or equal to 0")
        job_name = f"{name}-{rname}-{max(replicas - 1, 0)}"
        if len(job_name) > 63 or not _DNS1035.match(job_name):
            errors.append(f"spec.replicatedJobs[{i}].name: Invalid value: \"{job_name}\": "
                          "a lowercase RFC 1035 label of at most 63 characters is required for the child Job names")
        pod_spec = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
        if not pod_spec.get("containers"):
            errors.append(f"{path}.template.spec.template.spec.containers: Required value")
        deps = rjob.get("dependsOn") or []
        if deps and i == 0:
            errors.append(f"{path}.dependsOn: Invalid value: the first replicated job cannot depend on another")
        for dep in deps:
            if dep.get("name") not in names[:i]:
                errors.append(f"{path}.dependsOn: Invalid value: \"{dep.get('name')}\": must name an earlier replicated job")
            if dep.get("status") not in ("Ready", "Complete"):
                errors.append(f"{path}.dependsOn.status: Unsupported value: \"{dep.get('status')}\": supported values: \"Ready\", \"Complete\"")
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in names:
            errors.append(f"spec.successPolicy.targetReplicatedJobs: Invalid value: \"{target}\": must name a replicated job")
    operator = (spec.get("successPolicy") or {}).get("operator", "All")
    if operator not in ("All", "Any"):
        errors.append(f"spec.successPolicy.operator: Unsupported value: \"{operator}\": supported values: \"All\", \"Any\"")
    errors += _validate_failure_policy(spec, names, restart_job_gate)
    errors += _validate_coordinator(name, spec)
    return errors


def validate_jobset_update(new: Obj, old: Obj) -> list[str]:
    """Field errors of the JobSet validating webhook on UPDATE (reference 1.4)."""
    errors: list[str] = []
    ns, os_ = new.get("spec") or {}, old.get("spec") or {}
    for f in ("managedBy", "network", "successPolicy", "failurePolicy", "startupPolicy", "volumeClaimPolicies"):
        if ns.get(f) != os_.get(f):
            errors.append(f"spec.{f}: Invalid value: field is immutable")
    new_rj, old_rj = ns.get("replicatedJobs") or [], os_.get("replicatedJobs") or []
    if new_rj != old_rj:
        suspended = bool(ns.get("suspend")) or bool(os_.get("suspend"))
        if not suspended or _strip_scheduling(new_rj) != _strip_scheduling(old_rj):
            errors.append("spec.replicatedJobs: Invalid value: field is immutable")
    return errors


# --- helpers ------------------------------------------------------------------------


def job_key_hash(namespace: str, job_name: str) -> str:
    return hashlib.sha1(f"{namespace}/{job_name}".encode()).hexdigest()


def pods_per_job(job_spec: dict[str, Any]) -> int:
    parallelism = job_spec.get("parallelism")
    completions = job_spec.get("completions")
    p = 1 if parallelism is None else int(parallelism)
    return min(p, int(completions)) if completions is not None else p


def _label_int(obj: Obj, key: str) -> int:
    try:
        return int(((obj.get("metadata") or {}).get("labels") or {}).get(key, "0"))
    except ValueError:
        return 0


def _rjob_of(job: Obj) -> str:
    return str(((job.get("metadata") or {}).get("labels") or {}).get(RJOB_NAME, ""))


def _failed_at(job: Obj) -> float:
    c = find_condition(job, "Failed") or {}
    return parse_time(c.get("lastTransitionTime")) or 0.0


class JobSetController(Controller):
    name = "jobset"
    workers = 2

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self.cache.add_handler(JOBSETS.plural, self._on_jobset)
        self.cache.add_handler(JOBS.plural, self._on_job)

    def _on_jobset(self, event: str, obj: Obj, old: Obj | None) -> None:
        # Own status writes are not filtered out (unlike the Job controller and
        # the kubelet): restarts and terminal handling continue on the next pass.
        md = obj["metadata"]
        self.queue.add((md.get("namespace") or "", md["name"]))

    def _on_job(self, event: str, obj: Obj, old: Obj | None) -> None:
        owner = controller_owner_name(obj, "JobSet")
        if owner is not None:
            self.queue.add((obj["metadata"].get("namespace") or "", owner))

    def resync_keys(self) -> Iterable[Hashable]:
        return self.cache.keys(JOBSETS.plural)

    # --- reconcile ---------------------------------------------------------------

    def reconcile(self, key: Hashable) -> float | None:
        ns, name = cast(Key, key)
        js = self.cache.get(JOBSETS.plural, ns, name)
        if js is None or is_deleting(js):
            return None
        spec = js.get("spec") or {}
        managed_by = spec.get("managedBy")
        if managed_by and managed_by != MANAGED_BY:
            return None
        now = self.clock.now()
        uid = js["metadata"]["uid"]
        old_status = js.get("status") or {}
        status: dict[str, Any] = clone(old_status)
        status.setdefault("restarts", 0)
        conds: list[dict[str, Any]] = status.setdefault("conditions", [])
        restarts = int(status.get("restarts") or 0)
        rjobs = spec.get("replicatedJobs") or []
        suspended = bool(spec.get("suspend"))
        events: list[tuple[str, str, str]] = []

        children = [j for j in self.cache.owned(JOBS.plural, uid) if controller_owner_uid(j) == uid]
        previous, failed, succeeded, active = [], [], [], []
        for job in children:
            if _label_int(job, RESTART_ATTEMPT) < restarts:
                previous.append(job)
            elif condition_true(job, "Failed"):
                failed.append(job)
            elif condition_true(job, "Complete"):
                succeeded.append(job)
            else:
                active.append(job)

        counters = self._counters(rjobs, failed, succeeded, active)
        status["replicatedJobsStatus"] = sorted(counters.values(), key=lambda r: r["name"], reverse=True)

        requeue: float | None = None
        job_writes: list[tuple[str, Obj]] = []  # ("update"|"status"|"create"|"delete", job)

        finished = condition_true(js, "Completed") or condition_true(js, "Failed")
        if finished:
            job_writes += [("delete", j) for j in active if not is_deleting(j)]
            requeue = self._ttl(js, now)
            if requeue == 0.0:
                self.ctx.delete(JOBSETS, ns, name, "Foreground", uid=uid)
                return None
        else:
            job_writes += [("delete", j) for j in previous if not is_deleting(j)]
            total = sum(int(r.get("replicas", 1)) for r in rjobs)
            if not suspended and sum(c["ready"] + c["succeeded"] for c in counters.values()) == total:
                _set_condition(conds, events, "Normal", "RestartingJobSet", "False", "JobsReady", "all jobs are ready", now)
            if failed:
                self._failure_policy(js, status, failed, now, events)
            elif succeeded and self._success(spec, counters, succeeded):
                _set_condition(conds, events, "Normal", "Completed", "True", "AllJobsCompleted", "jobset completed successfully", now)
                _set_condition(conds, events, "Normal", "RestartingJobSet", "False", "JobSetCompleted", "jobset completed successfully", now)
                status["terminalState"] = "Completed"
            else:
                job_writes += self._create_missing(js, rjobs, counters, children, previous, restarts)
                if suspended:
                    job_writes += [("update", self._suspended_copy(j)) for j in active if not (j.get("spec") or {}).get("suspend")]
                    _set_condition(conds, events, "Normal", "Suspended", "True", "SuspendedJobs", "jobset is suspended", now)
                    _set_condition(conds, events, "Normal", "RestartingJobSet", "False", "JobSetSuspended", "jobset is suspended", now)
                else:
                    job_writes += self._resume(js, rjobs, counters, active)
                    _set_condition(conds, events, "Normal", "Suspended", "False", "ResumeJobs", "jobset is resumed", now)
            if condition_true({"status": status}, "Completed") or condition_true({"status": status}, "Failed"):
                requeue = self._ttl({"spec": spec, "status": status}, now)

        if not conds:
            status.pop("conditions")
        if status != old_status:
            js = self.ctx.update_status(JOBSETS, {**js, "status": status})
        for etype, reason, msg in events:
            self.ctx.event(js, JOBSETS, etype, reason, msg, COMPONENT)
        for op, job in job_writes:
            self._write_job(js, op, job)
        return requeue

    # --- pieces -------------------------------------------------------------------

    @staticmethod
    def _counters(rjobs: list[dict[str, Any]], failed: list[Obj], succeeded: list[Obj], active: list[Obj]) -> dict[str, dict[str, int]]:
        counters = {r["name"]: {"name": r["name"], "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0} for r in rjobs}
        for job in failed:
            if _rjob_of(job) in counters:
                counters[_rjob_of(job)]["failed"] += 1
        for job in succeeded:
            if _rjob_of(job) in counters:
                counters[_rjob_of(job)]["succeeded"] += 1
        for job in active:
            c = counters.get(_rjob_of(job))
            if c is None:
                continue
            jspec, jst = job.get("spec") or {}, job.get("status") or {}
            if jspec.get("suspend"):
                c["suspended"] += 1
            if int(jst.get("active") or 0) > 0:
                c["active"] += 1
            if int(jst.get("ready") or 0) + int(jst.get("succeeded") or 0) >= pods_per_job(jspec):
                c["ready"] += 1
        return counters

    def _ttl(self, js: Obj, now: float) -> float | None:
        ttl = (js.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return None
        cond = next((c for c in (js.get("status") or {}).get("conditions") or []
                     if c.get("type") in ("Completed", "Failed") and c.get("status") == "True"), None)
        if cond is None:
            return None
        at = parse_time(cond.get("lastTransitionTime")) or now
        remaining = at + float(ttl) - now
        return 0.0 if remaining <= 0 else remaining

    @staticmethod
    def _success(spec: dict[str, Any], counters: dict[str, dict[str, int]], succeeded: list[Obj]) -> bool:
        policy = spec.get("successPolicy") or {"operator": "All"}
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in spec.get("replicatedJobs") or []]
        done = sum(1 for j in succeeded if _rjob_of(j) in targets)
        if policy.get("operator") == "Any":
            return done >= 1
        needed = sum(int(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or [] if r["name"] in targets)
        return done >= needed

    def _failure_policy(self, js: Obj, status: dict[str, Any], failed: list[Obj], now: float,
                        events: list[tuple[str, str, str]]) -> None:
        conds = status["conditions"]
        policy = (js.get("spec") or {}).get("failurePolicy")
        first = min(failed, key=_failed_at)
        if policy is None:
            self._fail(status, "FailedJobs", f"jobset failed due to one or more job failures (first failed job: {first['metadata']['name']})", now, events)
            return
        action, rule_name, job = "RestartJobSet", None, first
        for rule in policy.get("rules") or []:
            matching = [j for j in failed if _rule_matches(rule, j)]
            if matching:
                action, rule_name, job = rule.get("action") or "RestartJobSet", rule.get("name"), min(matching, key=_failed_at)
                break
        job_name = job["metadata"]["name"]
        if action == "FailJobSet":
            self._fail(status, "FailJobSetFailurePolicyAction", f"applying FailJobSet failure policy action (first failed job: {job_name})", now, events)
            return
        # RestartJob* (alpha gate RestartJob) are simulated as whole-JobSet restarts.
        ignore_max = action in ("RestartJobSetAndIgnoreMaxRestarts", "RestartJobAndIgnoreMaxRestarts")
        counted = int(status.get("restartsCountTowardsMax") or 0)
        if not ignore_max and counted >= int(policy.get("maxRestarts") or 0):
            self._fail(status, "ReachedMaxRestarts", f"jobset failed due to reaching max number of restarts (first failed job: {job_name})", now, events)
            return
        status["restarts"] = int(status.get("restarts") or 0) + 1
        label = "RestartJobSetAndIgnoreMaxRestarts" if ignore_max else "RestartJobSet"
        if not ignore_max:
            status["restartsCountTowardsMax"] = counted + 1
        message = f"applying {label} failure policy action (first failed job: {job_name})"
        reason = f"FailurePolicy_{rule_name}" if rule_name else "DefaultFailurePolicy"
        # jobset pkg/controllers/failure_policy.go `failurePolicyRecreateAll`: the condition's own
        # event (only when it changed) plus the action event on every restart, both Warning.
        _set_condition(conds, events, "Warning", "RestartingJobSet", "True", reason, message, now)
        events.append(("Warning", f"{label}FailurePolicyAction", message))

    @staticmethod
    def _fail(status: dict[str, Any], reason: str, message: str, now: float, events: list[tuple[str, str, str]]) -> None:
        conds = status["conditions"]
        _set_condition(conds, events, "Warning", "Failed", "True", reason, message, now)
        _set_condition(conds, events, "Normal", "RestartingJobSet", "False", "JobSetFailed", "jobset failed", now)
        status["terminalState"] = "Failed"

    def _create_missing(self, js: Obj, rjobs: list[dict[str, Any]], counters: dict[str, dict[str, int]],
                        children: list[Obj], previous: list[Obj], restarts: int) -> list[tuple[str, Obj]]:
        spec = js.get("spec") or {}
        if previous and (spec.get("failurePolicy") or {}).get("restartStrategy") == "BlockingRecreate":
            return []
        existing = {j["metadata"]["name"] for j in children}
        out: list[tuple[str, Obj]] = []
        global_replicas = sum(int(r.get("replicas", 1)) for r in rjobs)
        group_replicas: dict[str, int] = {}
        for r in rjobs:
            group_replicas[r.get("groupName") or "default"] = group_replicas.get(r.get("groupName") or "default", 0) + int(r.get("replicas", 1))
        global_index = 0
        group_index: dict[str, int] = {}
        for rjob in rjobs:
            replicas = int(rjob.get("replicas", 1))
            group = rjob.get("groupName") or "default"
            allowed = _depends_satisfied(rjob, rjobs, counters)
            for idx in range(replicas):
                gi, grp_i = global_index + idx, group_index.get(group, 0) + idx
                name = f"{js['metadata']['name']}-{rjob['name']}-{idx}"
                if allowed and name not in existing:
                    out.append(("create", self._construct_job(js, rjob, idx, gi, grp_i, global_replicas, group_replicas[group], restarts)))
            global_index += replicas
            group_index[group] = group_index.get(group, 0) + replicas
        return out

    def _construct_job(self, js: Obj, rjob: dict[str, Any], idx: int, global_idx: int, group_idx: int,
                       global_replicas: int, group_replicas: int, restarts: int) -> Obj:
        jsmd = js["metadata"]
        ns, js_name = jsmd.get("namespace") or "default", jsmd["name"]
        spec = js.get("spec") or {}
        name = f"{js_name}-{rjob['name']}-{idx}"
        tmpl = clone(rjob.get("template") or {})
        tmd = tmpl.get("metadata") or {}
        keys = {
            JOBSET_NAME: js_name,
            JOBSET_UID: jsmd["uid"],
            RJOB_NAME: rjob["name"],
            RJOB_REPLICAS: str(rjob.get("replicas", 1)),
            GLOBAL_REPLICAS: str(global_replicas),
            JOB_INDEX: str(idx),
            JOB_GLOBAL_INDEX: str(global_idx),
            JOB_KEY: job_key_hash(ns, name),
            RESTART_ATTEMPT: str(restarts),
            GROUP_NAME: rjob.get("groupName") or "default",
            GROUP_REPLICAS: str(group_replicas),
            JOB_GROUP_INDEX: str(group_idx),
        }
        coord = spec.get("coordinator")
        subdomain = (spec.get("network") or {}).get("subdomain") or js_name
        if coord:
            keys[COORDINATOR] = f"{js_name}-{coord.get('replicatedJob')}-{coord.get('jobIndex', 0)}-{coord.get('podIndex', 0)}.{subdomain}"
        labels = dict(tmd.get("labels") or {})
        labels.update(keys)
        annotations = dict(tmd.get("annotations") or {})
        annotations.update(keys)
        for a in PROPAGATED_ANNOTATIONS:
            if a in (jsmd.get("annotations") or {}):
                annotations[a] = jsmd["annotations"][a]
        jspec = tmpl.get("spec") or {}
        ptmpl = jspec.setdefault("template", {})
        pmd = ptmpl.setdefault("metadata", {})
        pmd["labels"] = {**(pmd.get("labels") or {}), **keys}
        pmd["annotations"] = {**(pmd.get("annotations") or {}), **keys}
        if (spec.get("network") or {}).get("enableDNSHostnames", True):
            ptmpl.setdefault("spec", {})["subdomain"] = subdomain
        jspec["suspend"] = bool(spec.get("suspend"))
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations,
                         "ownerReferences": [owner_reference(js, JOBSETS)]},
            "spec": jspec,
        }

    @staticmethod
    def _suspended_copy(job: Obj) -> Obj:
        return {**job, "spec": {**job["spec"], "suspend": True}}

    def _resume(self, js: Obj, rjobs: list[dict[str, Any]], counters: dict[str, dict[str, int]],
                active: list[Obj]) -> list[tuple[str, Obj]]:
        by_rjob: dict[str, list[Obj]] = {}
        for job in active:
            if (job.get("spec") or {}).get("suspend"):
                by_rjob.setdefault(_rjob_of(job), []).append(job)
        out: list[tuple[str, Obj]] = []
        for rjob in rjobs:
            if not by_rjob.get(rjob["name"]) or not _depends_satisfied(rjob, rjobs, counters):
                continue
            src = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
            for job in by_rjob[rjob["name"]]:
                if (job.get("status") or {}).get("startTime"):
                    cleared = {k: v for k, v in job["status"].items() if k != "startTime"}
                    out.append(("status", {**job, "status": cleared}))
                new = clone(job)
                ptmpl = new["spec"].setdefault("template", {})
                pmd = ptmpl.setdefault("metadata", {})
                smd = src.get("metadata") or {}
                pmd["labels"] = {**(pmd.get("labels") or {}), **(smd.get("labels") or {})}
                pmd["annotations"] = {**(pmd.get("annotations") or {}), **(smd.get("annotations") or {})}
                pspec = ptmpl.setdefault("spec", {})
                sspec = src.get("spec") or {}
                if sspec.get("nodeSelector"):
                    pspec["nodeSelector"] = {**(pspec.get("nodeSelector") or {}), **sspec["nodeSelector"]}
                for f in ("tolerations", "schedulingGates"):
                    merged = list(pspec.get(f) or [])
                    for item in sspec.get(f) or []:
                        if item not in merged:
                            merged.append(item)
                    if merged:
                        pspec[f] = merged
                new["spec"]["suspend"] = False
                out.append(("resume", new))
        return out

    def _write_job(self, js: Obj, op: str, job: Obj) -> None:
        md = job["metadata"]
        ns = md.get("namespace") or ""
        if op == "create":
            try:
                self.ctx.create(JOBS, job)
            except Exception as exc:
                if getattr(exc, "code", None) == 409:
                    return  # created by a previous pass; the cache catches up
                self.ctx.event(js, JOBSETS, "Warning", "JobCreationFailed", str(exc), COMPONENT)
                raise
        elif op == "delete":
            self.ctx.delete(JOBS, ns, md["name"], "Foreground", uid=md.get("uid"))
        elif op == "status":
            self.ctx.update_status(JOBS, job)
        elif op == "resume":
            # The status write above bumped the RV; re-apply onto the fresh copy.
            cur = self.cache.get(JOBS.plural, ns, md["name"])
            if cur is not None and cur["metadata"].get("uid") == md.get("uid"):
                fresh = clone(cur)
                fresh["spec"] = job["spec"]
                job = fresh
            self.ctx.update(JOBS, job)
        else:
            self.ctx.update(JOBS, job)


def _set_condition(conds: list[dict[str, Any]], events: list[tuple[str, str, str]], event_type: str,
                   ctype: str, status: str, reason: str, message: str, now: float) -> bool:
    """Set a JobSet condition and queue its event when it changed.

    jobset pkg/controllers/jobset_controller.go `setCondition`: every condition
    change (status, reason or message) enqueues an event with the condition's
    reason and message, emitted only after the status update succeeds; a False
    condition that does not exist yet is not added (and emits nothing).
    """
    changed = set_condition(conds, ctype, status, reason, message, now, append_false=False)
    if changed:
        events.append((event_type, reason, message))
    return changed


def _rule_matches(rule: dict[str, Any], job: Obj) -> bool:
    cond = find_condition(job, "Failed") or {}
    reasons = rule.get("onJobFailureReasons") or []
    if reasons and cond.get("reason") not in reasons:
        return False
    patterns = rule.get("onJobFailureMessagePatterns") or []
    if patterns and not any(re.search(p, cond.get("message") or "") for p in patterns):
        return False
    targets = rule.get("targetReplicatedJobs") or []
    return not targets or _rjob_of(job) in targets


def _depends_satisfied(rjob: dict[str, Any], rjobs: list[dict[str, Any]], counters: dict[str, dict[str, int]]) -> bool:
    for dep in rjob.get("dependsOn") or []:
        c = counters.get(dep.get("name"))
        replicas = next((int(r.get("replicas", 1)) for r in rjobs if r["name"] == dep.get("name")), 0)
        if c is None:
            return False
        if dep.get("status") == "Complete":
            if c["succeeded"] < replicas:
                return False
        elif c["ready"] + c["succeeded"] + c["failed"] < replicas:
            return False
    return True
