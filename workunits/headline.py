"""One line, short first: why an execution is not running, or why it failed (issue 38, item 4).

Pure: from what the execution row stores (state, system message, scheduling
information) and the work unit's queue name. The one owner of "why is it not
running": `explain` reads it once into the headline and a structured reason
(``{"code": "WAITING_FOR_QUOTA", "positionInQueue": 3, ...}``), `sentence`
words it as everyone prints it. The pages (``ui.present.why_not_running``)
show the sentence in the table, the header and the sweep's "why" cell, and
``GET /v1/experiments/{xid}/headlines`` (`for_experiment`) answers the same
sentence and reason to ``xmc status`` and ``xmc why``, which print it as is; the details (pods,
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


#: The structured reason: ``{"code": CODE, ...}`` with the numbers the headline words (camelCase keys).
Reason = dict[str, Any]


def failure(text: str) -> str:
    """The headline of a failure message (the reconciler's explanation, a dead letter, a sweep repair)."""
    return _failure(text)[0]


def _failure(text: str) -> tuple[str, Reason]:
    """(the headline of a failure message, its cause: ``{"cause": ..., "exitCode", "signal", "replica", ...}``)."""
    if not text:
        return "failed", {"cause": "UNKNOWN"}
    oom = _OOM.search(text)
    if oom:
        return f"out of memory (OOMKilled) in {oom[1] or oom[2]}", {"cause": "OUT_OF_MEMORY", "replica": oom[1] or oom[2]}
    code, backoff, signal = _EXIT.search(text), _BACKOFF.search(text), _SIGNAL.search(text)
    what = f"exited with code {code[1]}" if code else f"killed by signal {signal[1]}" if signal else ""
    cause: Reason = ({"cause": "EXIT_CODE", "exitCode": int(code[1])} if code
                     else {"cause": "SIGNAL", "signal": signal[1]} if signal else {})
    if what and backoff:
        limit = f" (retry limit {backoff[2]})" if backoff[2] is not None else ""
        return f"{what}, {_times(int(backoff[1]))}{limit}", {**cause, **_tries(backoff)}
    if what:
        restarts = _RESTARTS.search(text)
        return (what + (f", after {restarts[1]} restart(s)" if restarts else ""),
                {**cause, **({"restarts": int(restarts[1])} if restarts else {})})
    start = _START.search(text)
    if start:
        return f"could not start: {start[1]}", {"cause": "COULD_NOT_START", "detail": start[1]}
    if text.startswith("the cluster refused"):
        return clean(text.split(";", 1)[0]), {"cause": "CLUSTER_REFUSED"}
    if "Pod lost with its node" in text:
        return "its pod was lost with its node", {"cause": "NODE_LOST"}
    if "without passing the XMC finalizer" in text:
        return "its JobSet was deleted outside XMC", {"cause": "DELETED_OUTSIDE_XMC"}
    if backoff:
        return (f"failed {_times(int(backoff[1]))}" + (f" (retry limit {backoff[2]})" if backoff[2] else ""),
                {"cause": "RETRIES_EXHAUSTED", **_tries(backoff)})
    return clean(text.split(". ", 1)[0]), {"cause": "OTHER"}


def _tries(backoff: re.Match[str]) -> Reason:
    return {"failures": int(backoff[1]), **({"retryLimit": int(backoff[2])} if backoff[2] is not None else {})}


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


def _crash_loop_reason(text: str) -> Reason:
    loop = _LOOP.match(text)
    assert loop is not None
    return {"restarts": int(loop[1]), **({"retryLimit": int(loop[2])} if loop[2] else {})}


def _preempted(*texts: str) -> bool:
    return any("preempt" in t.lower() for t in texts)


def headline(state: str, system_message: Message, scheduling_information: Message, queue_name: str = "") -> str:
    """The one line a person reads first ("" for a unit that runs or ended well)."""
    return explain(state, system_message, scheduling_information, queue_name)[0]


def explain(state: str, system_message: Message, scheduling_information: Message,
            queue_name: str = "") -> tuple[str, Reason]:
    """(`headline`, the structured reason): one reading of the stored execution, for every state.

    The reason's ``code`` says which case the headline words (``WAITING_FOR_QUOTA``,
    ``PREEMPTED``, ``EVICTED``, ``SCHEDULING_PAUSED``, ``FAILED``, ``PARTIALLY_FAILED``,
    ``ERROR`` (an error while queued or starting), ``CRASH_LOOPING``, ``WARNING`` (the
    actuator's retry), ``HANDING_TO_CLUSTER``, ``RESTARTING``, ``STARTING``; else the state
    itself: ``RUNNING``, ``COMPLETED``, ...), with the numbers it names: ``queue``,
    ``positionInQueue``, ``totalInQueue``; a failure's ``cause`` (``EXIT_CODE``,
    ``OUT_OF_MEMORY``, ``SIGNAL``, ...) and ``exitCode``, ``failures``, ``retryLimit``,
    ``restarts``, ``replica``.
    """
    system, scheduling = _text(system_message), _text(scheduling_information)
    queue = ((scheduling_information or {}).get("auxiliaryInfo") or {}).get("queueInfo") or {}
    position, total = queue.get("positionInQueue"), queue.get("totalWorkloadsInQueue")
    where = queue_name or "the queue"
    if state in ("FAILED", "PARTIALLY_FAILED"):
        words, cause = _failure(system)
        return ("partly failed: " if state == "PARTIALLY_FAILED" else "") + words, {"code": state, **cause}
    if state in ("SCHEDULING", "DESCHEDULING"):
        if _severity(system_message) in ("ERROR", "FATAL") and system:
            words, cause = _failure(system)
            return words, {"code": "ERROR", **cause}
        if _preempted(scheduling, system):
            return "preempted by a higher-priority workload", {"code": "PREEMPTED"}
        if state == "DESCHEDULING":
            return "evicted, waiting to be queued again", {"code": "EVICTED"}
        waiting: Reason = {"code": "WAITING_FOR_QUOTA", "queue": queue_name}
        if position:
            waiting["positionInQueue"] = int(position)
            if total:
                waiting["totalInQueue"] = int(total)
            return f"waiting for quota in {where}: position {position}" + (f" of {total}" if total else ""), waiting
        return f"waiting for quota in {where}", waiting
    if state == "SCHEDULING_PAUSED":
        return "scheduling is paused by the operators", {"code": "SCHEDULING_PAUSED"}
    if state in ("INITIALIZING", "RESTARTING"):
        if _severity(system_message) in ("WARNING", "ERROR", "FATAL") and system:
            return clean(system), {"code": "WARNING"}  # the actuator's retry warning: short already
        if state == "INITIALIZING":
            return "being handed to the cluster", {"code": "HANDING_TO_CLUSTER"}
        return "restarting", {"code": "RESTARTING"}
    if state == "STARTING":
        if _severity(system_message) in ("ERROR", "FATAL") and system:
            words, cause = _failure(system)
            return words, {"code": "ERROR", **cause}
        if _severity(system_message) == "WARNING" and crash_loop(system):
            return crash_loop(system), {"code": "CRASH_LOOPING", **_crash_loop_reason(system)}
        return "admitted; its pods are starting", {"code": "STARTING"}
    return "", {"code": state or "UNSPECIFIED"}


def sentence(head: str, reason: Reason, estimate: str = "") -> str:
    """The headline as the pages and ``xmc`` print it: capitalised, with a queued unit's estimated start
    (``eta.estimate_for``) after it; "" when there is nothing to say."""
    if not head:
        return ""
    said = head[0].upper() + head[1:]
    return f"{said}. {estimate}" if estimate and reason.get("code") == "WAITING_FOR_QUOTA" else said


def describe(state: str, system_message: Message, scheduling_information: Message, queue_name: str = "",
             estimate: str = "") -> dict[str, Any]:
    """``{"headline", "sentence", "reason"}`` of one execution: what the headlines read answers per unit
    and what the pages show (``ui.present.why_not_running``)."""
    head, reason = explain(state, system_message, scheduling_information, queue_name)
    estimate = estimate if reason["code"] == "WAITING_FOR_QUOTA" else ""
    return {"headline": f"{head}. {estimate}" if head and estimate else head,
            "sentence": sentence(head, reason, estimate), "reason": reason}


def for_experiment(xid: int) -> list[dict[str, Any]]:
    """Every work unit's current state, headline, sentence and reason (`describe`): the REST read
    ``xmc.api.headlines`` that ``xmc why`` and ``xmc status`` print.

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
        estimate = eta.estimate_for(state, {"scheduling_information": scheduling}, queue, admissions, now)
        out.append({"name": f"experiments/{xid}/workUnits/{wid}", "executionId": eid, "state": state,
                    **describe(state, system, scheduling, queue, estimate)})
    return out
