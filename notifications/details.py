"""What a failure message says about each failed work unit, so the reader can act on it: the
job name, the arguments that set it apart from its siblings, a short reason and the last log
line where known. Read when a message's body is built (its first try: send time), by
``notifications.services.deliver_many``; ``notifications.payloads`` renders it.

The reason and the last line come from how the containers ended
(``workunits.hooks.termination_of``, answered by the log archive in ``k8s_bridge``);
without that, the first line of the execution's system message.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from workunits import hooks
from workunits.models import WorkUnit, WorkUnitExecution

#: The longest reason and last line a message carries (a phone's screen, not the whole log).
REASON_MAX = 160
LINE_MAX = 200


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _jobs(executable: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return list((((executable or {}).get("jobset") or {}).get("jobs") or []))


def _args(executable: Mapping[str, Any] | None) -> dict[str, str]:
    """``name -> value`` of every job's arguments (prefixed by the job when there are several)."""
    jobs = _jobs(executable)
    found: dict[str, str] = {}
    for job in jobs:
        spec, prefix = job.get("spec") or {}, (f"{job.get('name')}." if len(jobs) > 1 else "")
        named = sorted((spec.get("args") or {}).items())
        listed = [(f"argv[{i}]", v) for i, v in enumerate(spec.get("argsList") or [])]
        for key, value in [*named, *listed]:
            found[prefix + key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return found


def _reason(terminations: list[hooks.Termination], system_message: Mapping[str, Any] | None) -> str:
    for t in terminations:
        where = f" in {t.container}" if t.container else ""
        if t.reason == "OOMKilled":
            return f"out of memory (OOMKilled){where}"
        if t.exit_code not in (None, 0):
            return f"exited with code {t.exit_code}{where}" + (f" ({t.reason})" if t.reason not in ("", "Error") else "")
    text = str((system_message or {}).get("userFacingText") or "")
    return _short(text.strip().splitlines()[0], REASON_MAX) if text.strip() else ""


def failure_details(xid: int, units: Iterable[tuple[int, int]]) -> dict[tuple[int, int], dict[str, Any]]:
    """``(wid, eid) -> {"jobName", "args", "reason", "lastLogLine"}`` for failed executions of one
    experiment; ``args`` holds only the arguments whose values differ across its work units."""
    wanted = sorted(set(units))
    if not wanted:
        return {}
    args = {wid: _args(executable) for wid, executable in
            WorkUnit.objects.filter(experiment_id=xid).values_list("wid", "executable")}
    names = sorted({n for a in args.values() for n in a})
    differing = [n for n in names if len({a.get(n) for a in args.values()}) > 1]
    jobs = {wid: ", ".join(str(j.get("name") or "") for j in _jobs(executable)) for wid, executable in
            WorkUnit.objects.filter(experiment_id=xid, wid__in=[w for w, _ in wanted])
            .values_list("wid", "executable")}
    messages = {(wid, eid): message for wid, eid, message in WorkUnitExecution.objects.filter(
        work_unit__experiment_id=xid, work_unit__wid__in=[w for w, _ in wanted])
        .values_list("work_unit__wid", "eid", "system_message")}
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for wid, eid in wanted:
        ended = hooks.termination_of(xid, wid, eid)
        mine = args.get(wid, {})
        found[(wid, eid)] = {
            "jobName": jobs.get(wid, ""),
            "args": {n: _short(mine[n], 80) for n in differing if n in mine},
            "reason": _reason(ended, messages.get((wid, eid))),
            "lastLogLine": _short(next((t.last_line for t in ended if t.last_line), ""), LINE_MAX),
        }
    return found
