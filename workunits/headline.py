"""One line, short first: why an execution is not running, or why it failed (issue 38, item 4).

Pure: from what the execution row stores (state, system message, scheduling
information) and the work unit's queue name. The pages (``ui.present``) show
it in the table, the header and the sweep's "why" cell; the details (pods,
containers, last lines, Kueue's words) stay in the messages, shown once on
the unit's page. The reconciler's texts it reads are written by
``k8s_bridge.reconciler.explain`` and ``workunits.services.failures``.

No UIDs, pod names or backoff limits in a headline: "exited with code 1,
twice (retry limit 1)", "out of memory (OOMKilled) in train-0", "waiting for
quota in demo-queue: position 3 of 7", "preempted by a higher-priority
workload".
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from workunits import eta
from workunits.choices import ExecutionState
from workunits.models import WorkUnitExecution

Message = Mapping[str, Any] | None

_UID = re.compile(r"\s*\(?\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b\)?", re.I)
_OOM = re.compile(r"Out of memory \(OOMKilled\): (?:replica (\S+)|pod (\S+))")
_EXIT = re.compile(r"exited with code (\d+)")
_SIGNAL = re.compile(r"was killed by signal (\w+)")
_RESTARTS = re.compile(r"after (\d+) restart\(s\)")
_BACKOFF = re.compile(r"after (\d+) failed pod\(s\)(?: \(backoffLimit (\d+)\))?")
_START = re.compile(r"could not start: (\w+)")
_LOOP = re.compile(r"^Crash-looping: .*?; (\d+) failure\(s\) so far(?: \(backoffLimit (\d+)\))?(?:; (.*))?$")
_LIMIT = 120


def _text(message: Message) -> str:
    return str((message or {}).get("userFacingText") or "").strip()


def _severity(message: Message) -> str:
    return str((message or {}).get("severity") or "")


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def clean(text: str) -> str:
    """One line, without UIDs, at most ~120 characters."""
    flat = " ".join(_UID.sub("", text).split())
    return flat if len(flat) <= _LIMIT else flat[: _LIMIT - 1] + "…"


def failure(text: str) -> str:
    """The headline of a failure message (the reconciler's explanation, a dead letter, a sweep repair)."""
    if not text:
        return "failed"
    oom = _OOM.search(text)
    if oom:
        return f"out of memory (OOMKilled) in {oom[1] or oom[2]}"
    code, backoff, signal = _EXIT.search(text), _BACKOFF.search(text), _SIGNAL.search(text)
    what = f"exited with code {code[1]}" if code else f"killed by signal {signal[1]}" if signal else ""
    if what and backoff:
        limit = f" (retry limit {backoff[2]})" if backoff[2] is not None else ""
        return f"{what}, {_times(int(backoff[1]))}{limit}"
    if what:
        restarts = _RESTARTS.search(text)
        return what + (f", after {restarts[1]} restart(s)" if restarts else "")
    start = _START.search(text)
    if start:
        return f"could not start: {start[1]}"
    if text.startswith("the cluster refused"):
        return clean(text.split(";", 1)[0])
    if "Pod lost with its node" in text:
        return "its pod was lost with its node"
    if "without passing the XMC finalizer" in text:
        return "its JobSet was deleted outside XMC"
    if backoff:
        return f"failed {_times(int(backoff[1]))}" + (f" (retry limit {backoff[2]})" if backoff[2] else "")
    return clean(text.split(". ", 1)[0])


def crash_loop(text: str) -> str:
    """``crash-looping: exited with code 3, 4 restarts (retry limit 5); next try about 01:30:12 UTC``
    from the reconciler's WARNING (``k8s_bridge.reconciler.explain.crash_loop_message``); "" for another text."""
    loop = _LOOP.match(text)
    if not loop:
        return ""
    oom = "OOMKilled" in text
    code, signal = _EXIT.search(text), _SIGNAL.search(text)
    what = ("out of memory (OOMKilled)" if oom else f"exited with code {code[1]}" if code
            else f"killed by signal {signal[1]}" if signal else "failed")
    restarts = int(loop[1])
    head = f"crash-looping: {what}, {restarts} restart{'s' if restarts != 1 else ''}"
    head += f" (retry limit {loop[2]})" if loop[2] else ""
    return head + (f"; {loop[3]}" if loop[3] else "")


def _preempted(*texts: str) -> bool:
    return any("preempt" in t.lower() for t in texts)


def headline(state: str, system_message: Message, scheduling_information: Message, queue_name: str = "") -> str:
    """The one line a person reads first ("" for a unit that runs or ended well)."""
    system, scheduling = _text(system_message), _text(scheduling_information)
    queue = ((scheduling_information or {}).get("auxiliaryInfo") or {}).get("queueInfo") or {}
    position, total = queue.get("positionInQueue"), queue.get("totalWorkloadsInQueue")
    where = queue_name or "the queue"
    if state in ("FAILED", "PARTIALLY_FAILED"):
        return ("partly failed: " if state == "PARTIALLY_FAILED" else "") + failure(system)
    if state in ("SCHEDULING", "DESCHEDULING"):
        if _severity(system_message) in ("ERROR", "FATAL") and system:
            return failure(system)
        if _preempted(scheduling, system):
            return "preempted by a higher-priority workload"
        if state == "DESCHEDULING":
            return "evicted, waiting to be queued again"
        if position:
            return f"waiting for quota in {where}: position {position}" + (f" of {total}" if total else "")
        return f"waiting for quota in {where}"
    if state == "SCHEDULING_PAUSED":
        return "scheduling is paused by the operators"
    if state in ("INITIALIZING", "RESTARTING"):
        if _severity(system_message) in ("WARNING", "ERROR", "FATAL") and system:
            return clean(system)  # the actuator's retry warning: short already
        return "being handed to the cluster" if state == "INITIALIZING" else "restarting"
    if state == "STARTING":
        if _severity(system_message) in ("ERROR", "FATAL") and system:
            return failure(system)
        if _severity(system_message) == "WARNING" and crash_loop(system):
            return crash_loop(system)
        return "admitted; its pods are starting"
    return ""


def for_experiment(xid: int) -> list[dict[str, Any]]:
    """Every work unit's current state and headline (the REST read ``xmc.api.headlines``, ``xmc why``/``status``).

    One query (and one per queue that units wait in with a position, for the estimated
    start that `workunits.eta.estimate_for` adds when it is shown); the caller has checked
    the reader's access.
    """
    rows = (WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, execution_state=ExecutionState.ACTIVE)
            .order_by("work_unit__wid")
            .values_list("work_unit__wid", "eid", "state", "system_message", "scheduling_information",
                         "work_unit__executable"))
    def queue_of(executable: Any) -> str:
        return str(((executable or {}).get("schedulingConstraints") or {}).get("queueName") or "")

    waiting = [queue_of(r[5]) for r in rows if r[2] == "SCHEDULING" and eta.queue_position({"scheduling_information": r[4]})]
    admissions = eta.recent_admissions(waiting, eta.ESTIMATE_WINDOW_S) if waiting and eta.shown() else {}
    now = timezone.now()
    out = []
    for wid, eid, state, system, scheduling, executable in rows:
        queue = queue_of(executable)
        head = headline(state, system, scheduling, queue)
        estimate = eta.estimate_for(state, {"scheduling_information": scheduling}, queue, admissions, now)
        out.append({"name": f"experiments/{xid}/workUnits/{wid}", "executionId": eid, "state": state,
                    "headline": f"{head}. {estimate}" if head and estimate else head})
    return out
