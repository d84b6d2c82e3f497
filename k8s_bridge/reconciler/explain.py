"""Why an execution failed, in one ERROR system message, from what the cluster reports.

Pure functions over API objects (plain dicts), called by
``k8s_bridge.reconciler.mapping.observe`` (PARTIALLY_FAILED, FAILED) and by the
finalizer path. Every cause the cluster can report is named, with where it
happened (replicated job and index, pod, container):

* the JobSet's own verdict (``Failed`` condition: ``FailedJobs``,
  ``ReachedMaxRestarts`` after N restarts, ``FailJobSetFailurePolicyAction``);
* each failed Job's reason: ``BackoffLimitExceeded`` after N failed pods,
  ``DeadlineExceeded`` (``activeDeadlineSeconds``), ``PodFailurePolicy``;
* each failed container: exit code, or the signal that killed it (exit
  128+n), ``OOMKilled``; a container that could not start (image pull,
  create/start errors);
* pods lost with their node, evicted, or deleted;

and, when the log archive (`k8s_bridge.logs.archive`) has them, the last
lines of the first failed container's log in ``auxiliaryInfo.stackTrace``
(the failure card shows them). `deactivation_message` explains a Workload
Kueue deactivated (a rejected admission check, the requeuing limit): the
JobSet then stays suspended, so the execution stays SCHEDULING with this ERROR.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

Obj = Mapping[str, Any]
#: (pod name, container) -> (instance, last lines, exit code, reason) of archived logs
Tails = Mapping[tuple[str, str], tuple[int, list[str], int | None, str]]

NODE_LOSS_REASONS = frozenset({"NodeLost", "Evicted", "Terminated", "NodeShutdown", "Shutdown"})
STARTUP_FAILURE_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
           9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
MAX_ITEMS = 3


def _md(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _name(obj: Obj) -> str:
    return str(_md(obj).get("name", ""))


def _condition(obj: Obj, kind: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def replica(obj: Obj) -> str:
    labels = _md(obj).get("labels") or {}
    rjob = labels.get(RJOB_LABEL)
    if not rjob:
        return ""
    return f"{rjob}-{labels.get(JOB_INDEX_LABEL, '0')}"


def _where(pod: Obj, container: str | None = None) -> str:
    rep = replica(pod)
    text = f"replica {rep} (pod {_name(pod)})" if rep else f"pod {_name(pod)}"
    return f"{text} container {container}" if container else text


def exit_text(term: Mapping[str, Any]) -> str:
    """``exited with code 1 (Error)``, ``was killed by signal 9 (SIGKILL, exit code 137)``, ``was OOMKilled ...``."""
    code = term.get("exitCode")
    reason = str(term.get("reason") or "")
    signal = term.get("signal")
    if reason == "OOMKilled":
        return f"was OOMKilled: out of memory (exit code {code})"
    if signal is None and isinstance(code, int) and 128 < code < 160:
        signal = code - 128
    message = str(term.get("message") or "").strip()
    detail = f": {message[:200]}" if message else ""
    if signal:
        name = SIGNALS.get(int(signal), "")
        named = f", {name}" if name else ""
        return f"was killed by signal {signal} ({reason or 'Error'}{named}, exit code {code}){detail}"
    return f"exited with code {code} ({reason or 'Error'}){detail}"


def _failed_containers(pods: Sequence[Obj]) -> list[tuple[Obj, str, Mapping[str, Any], int]]:
    """(pod, container, terminated state, restartCount) of every container that ended badly."""
    out = []
    for pod in sorted(pods, key=lambda p: (replica(p), _name(p))):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for term in ((cs.get("state") or {}).get("terminated"), (cs.get("lastState") or {}).get("terminated")):
                if term and (term.get("exitCode") not in (0, None) or term.get("reason") == "OOMKilled"):
                    out.append((pod, str(cs.get("name", "")), term, int(cs.get("restartCount") or 0)))
                    break
    return out


def _lost(pods: Sequence[Obj], deleted: Sequence[Obj]) -> list[str]:
    lost = []
    for pod in deleted:
        node = (pod.get("spec") or {}).get("nodeName") or "its node"
        why = (pod.get("status") or {}).get("reason") or "deleted"
        lost.append(f"{_where(pod)} on {node} ({why})")
    for pod in sorted(pods, key=_name):
        status = pod.get("status") or {}
        disrupted = _condition(pod, "DisruptionTarget")
        if (status.get("reason") in NODE_LOSS_REASONS or disrupted is not None
                or (_md(pod).get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed"))):
            node = (pod.get("spec") or {}).get("nodeName") or "its node"
            why = status.get("reason") or (disrupted or {}).get("reason") or "deleted"
            lost.append(f"{_where(pod)} on {node} ({why})")
    return list(dict.fromkeys(lost))


def _waiting(pods: Sequence[Obj]) -> list[str]:
    out = []
    for pod in sorted(pods, key=_name):
        images = {c.get("name"): c.get("image", "") for c in (pod.get("spec") or {}).get("containers") or []}
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            if reason in STARTUP_FAILURE_REASONS:
                msg = str(waiting.get("message") or "")
                out.append(f"{_where(pod, str(cs.get('name', '')))} (image {images.get(cs.get('name')) or cs.get('image', '')})"
                           f" could not start: {reason}" + (f": {msg[:200]}" if msg else ""))
    return out


def _jobs(jobs: Sequence[Obj]) -> list[str]:
    out = []
    for job in sorted(jobs, key=lambda j: (replica(j), _name(j))):
        cond = _condition(job, "Failed") or _condition(job, "FailureTarget")
        if cond is None:
            continue
        reason = str(cond.get("reason") or "Failed")
        spec = job.get("spec") or {}
        failed = int((job.get("status") or {}).get("failed") or 0)
        where = f"replicated job {replica(job) or _name(job)} (job {_name(job)})"
        if reason == "BackoffLimitExceeded":
            limit = spec.get("backoffLimit")
            out.append(f"{where}: BackoffLimitExceeded, backoff limit reached after {failed} failed pod(s)"
                       + (f" (backoffLimit {limit})" if limit is not None else ""))
        elif reason == "DeadlineExceeded":
            out.append(f"{where}: DeadlineExceeded, active longer than its deadline"
                       f" (activeDeadlineSeconds {spec.get('activeDeadlineSeconds')})")
        else:
            message = str(cond.get("message") or "")
            out.append(f"{where}: {reason}" + (f": {message[:200]}" if message else ""))
    return out


def _verdict(jobset: Obj | None) -> str:
    if not jobset:
        return ""
    cond = _condition(jobset, "Failed")
    if cond is None:
        return ""
    reason = str(cond.get("reason") or "Failed")
    message = str(cond.get("message") or "")
    if reason == "ReachedMaxRestarts":
        restarts = int((jobset.get("status") or {}).get("restarts") or 0)
        policy = (jobset.get("spec") or {}).get("failurePolicy") or {}
        return (f"JobSet failed after {restarts} restart(s) (maxRestarts {policy.get('maxRestarts', 0)},"
                f" ReachedMaxRestarts): {message}")
    return f"JobSet failed ({reason}): {message}" if message else f"JobSet failed ({reason})"


def _some(items: list[str]) -> str:
    more = f" (and {len(items) - MAX_ITEMS} more)" if len(items) > MAX_ITEMS else ""
    return "; ".join(items[:MAX_ITEMS]) + more


def failure_message(jobset: Obj | None, pods: Sequence[Obj], deleted: Sequence[Obj] = (), jobs: Sequence[Obj] = (),
                    tails: Tails | None = None, waited_on: str = "") -> dict[str, Any] | None:
    """The ERROR message explaining a failure (None when the cluster says nothing at all).

    ``waited_on`` is what the pods were last seen waiting on (the reconciler
    remembers it: pods that could not start are often deleted by the time
    their Job fails, e.g. at its deadline).
    """
    parts: list[str] = []
    verdict = _verdict(jobset)
    if verdict:
        parts.append(verdict)
    job_parts = _jobs(jobs)
    if job_parts:
        parts.append(_some(job_parts))
    failed = _failed_containers(pods)
    oom = [f for f in failed if f[2].get("reason") == "OOMKilled"]
    if oom:
        parts.append("Out of memory (OOMKilled): " + _some([f"{_where(p, c)}" for p, c, _, _ in oom]))
    others = [f for f in failed if f[2].get("reason") != "OOMKilled"]
    if others:
        parts.append(_some([f"{_where(p, c)} {exit_text(t)}" + (f" after {n} restart(s)" if n else "")
                            for p, c, t, n in others]))
    waiting = _waiting(pods)
    if waiting:
        parts.append(_some(waiting))
    elif waited_on and any(r in waited_on for r in STARTUP_FAILURE_REASONS):
        parts.append(f"Its pods could not start: {waited_on}")
    lost = _lost(pods, deleted)
    if lost:
        parts.append("Pod lost with its node or deleted (counts as a failure): " + _some(lost))
    if not parts:
        return None
    message: dict[str, Any] = {"severity": "ERROR", "source": "KUBERNETES", "userFacingText": ". ".join(parts)}
    tail = _tail(failed, tails or {})
    if tail:
        message["userFacingText"] += f". Last lines of {tail[0]} are attached"
        message["auxiliaryInfo"] = {"stackTrace": tail[1]}
    return message


def _tail(failed: list[tuple[Obj, str, Mapping[str, Any], int]], tails: Tails) -> tuple[str, str] | None:
    for pod, container, _, _ in failed:
        held = tails.get((_name(pod), container))
        if held and held[1]:
            return _where(pod, container), "\n".join(held[1])
    # A failed container whose pod is already gone: any archived failed instance.
    for (pod_name, container), (_, lines, code, reason) in sorted(tails.items()):
        if lines and (code not in (0, None) or reason == "OOMKilled"):
            return f"pod {pod_name} container {container}", "\n".join(lines)
    return None


#: The Job controller's pod back-off: 10 s doubling, capped at six minutes
#: (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-backoff-failure-policy).
POD_BACKOFF_BASE_S, POD_BACKOFF_CAP_S = 10.0, 360.0
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
CRASH_LOOP = "Crash-looping"


def _finished(term: Mapping[str, Any]) -> datetime | None:
    """When a terminated container finished (None if the cluster did not say)."""
    try:
        return datetime.fromisoformat(str(term.get("finishedAt") or "").replace("Z", "+00:00"))
    except ValueError:
        return None


def _backoff_limit(jobset: Obj, job_name: str) -> int | None:
    """``backoffLimit`` of the replicated job that ``job_name`` (``<jobset>-<rjob>-<index>``) belongs to."""
    base = _name(jobset)
    for rjob in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if job_name.startswith(f"{base}-{rjob.get('name')}-"):
            limit = ((rjob.get("template") or {}).get("spec") or {}).get("backoffLimit")
            return int(limit) if isinstance(limit, int) else 6
    return None


def crash_loop_message(jobset: Obj, pods: Sequence[Obj], now: datetime) -> dict[str, Any] | None:
    """A WARNING while the Job controller retries a failing pod of a running JobSet, else None.

    Between two tries nothing of the JobSet is active, so it read as a queue
    ("admitted; starting") for minutes (issue 38). Counted per Job, as its
    controller counts against ``backoffLimit``: failed pods, plus container
    restarts under ``restartPolicy: OnFailure``. Names the last exit, the
    count, the limit and the back-off before the next try.
    """
    per_job: dict[str, list[tuple[Obj, str, Mapping[str, Any], int]]] = {}
    for pod, container, term, restarts in _failed_containers(pods):
        job = str((_md(pod).get("labels") or {}).get(JOB_NAME_LABEL) or "")
        per_job.setdefault(job, []).append((pod, container, term, restarts))
    best: tuple[int, str, tuple[Obj, str, Mapping[str, Any], int]] | None = None
    for job, failed in per_job.items():
        pods_failed = sum(1 for p, *_ in failed if (p.get("status") or {}).get("phase") == "Failed")
        count = pods_failed + sum(n for p, _, _, n in failed if (p.get("status") or {}).get("phase") != "Failed")
        last = max(failed, key=lambda f: (_finished(f[2]) or datetime.min.replace(tzinfo=now.tzinfo), _name(f[0])))
        if count and (best is None or count > best[0]):
            best = (count, job, last)
    if best is None:
        return None
    count, job, (pod, container, term, _) = best
    limit = _backoff_limit(jobset, job)
    # No clock in the text: it stays the same until the next failure (one message per failure).
    delay = min(POD_BACKOFF_CAP_S, POD_BACKOFF_BASE_S * 2.0 ** max(0, count - 1))
    text = (f"{CRASH_LOOP}: {_where(pod, container)} {exit_text(term)}; {count} failure(s) so far"
            + (f" (backoffLimit {limit})" if limit is not None else "")
            + f"; next try {delay:.0f} s after the last exit")
    return {"severity": "WARNING", "source": "KUBERNETES", "userFacingText": text}


def deactivation_message(workload: Obj | None) -> dict[str, Any] | None:
    """ERROR for a Workload Kueue deactivated (it will not run until reactivated), else None."""
    if not workload:
        return None
    evicted = _condition(workload, "Evicted")
    inactive = (workload.get("spec") or {}).get("active") is False
    if evicted is None or not str(evicted.get("reason") or "").startswith("Deactivated"):
        return None
    if not inactive and evicted is None:
        return None
    reason = str(evicted.get("reason"))
    message = str(evicted.get("message") or "")
    if reason == "DeactivatedDueToAdmissionCheck":
        head = "Kueue deactivated the workload: an admission check rejected it"
    elif reason == "DeactivatedDueToRequeuingLimitExceeded":
        head = "Kueue deactivated the workload: it was requeued too many times (waitForPodsReady requeuing limit)"
    else:
        head = "The workload was deactivated (spec.active=false)"
    text = f"{head}; it will not be admitted again until reactivated ({reason}: {message})"
    return {"severity": "ERROR", "source": "SCHEDULER", "userFacingText": text}
