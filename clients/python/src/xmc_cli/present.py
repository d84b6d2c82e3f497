"""Pure helpers: API JSON in, what the terminal shows out (no I/O; tested alone)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

#: Work unit states in display order: (state, glyph, rich style, short label).
STATES: tuple[tuple[str, str, str, str], ...] = (
    ("RUNNING", "▶", "bold green", "running"),
    ("STARTING", "↑", "green", "starting"),
    ("SCHEDULING", "…", "yellow", "queued"),
    ("SCHEDULING_PAUSED", "‖", "yellow", "paused"),
    ("INITIALIZING", "∘", "cyan", "init"),
    ("RESTARTING", "↻", "cyan", "restarting"),
    ("DESCHEDULING", "↓", "yellow", "evicted"),
    ("PARTIALLY_FAILED", "!", "magenta", "part-failed"),
    ("STOPPING", "◌", "magenta", "stopping"),
    ("COMPLETED", "✓", "green", "done"),
    ("FAILED", "✗", "bold red", "failed"),
    ("STOPPED", "■", "dim", "stopped"),
)
GLYPH = {s: g for s, g, _, _ in STATES}
STYLE = {s: st for s, _, st, _ in STATES}
ORDER = {s: i for i, (s, _, _, _) in enumerate(STATES)}
TERMINAL = frozenset({"COMPLETED", "FAILED", "STOPPED"})
FAILED_STATES = frozenset({"FAILED"})


def state_of(work_unit: Mapping[str, Any]) -> str:
    execution = work_unit.get("currentWorkUnitExecution") or {}
    return str((execution.get("status") or {}).get("state") or "UNSPECIFIED")


def style_of(state: str) -> str:
    return STYLE.get(state, "")


def state_counts(experiment: Mapping[str, Any]) -> dict[str, int]:
    status = experiment.get("status") or {}
    counts: dict[str, int] = {}
    for item in status.get("childStateCounts") or []:
        n = int(item.get("count") or 0)
        if n:
            counts[str(item.get("state"))] = counts.get(str(item.get("state")), 0) + n
    return counts


def severity_counts(experiment: Mapping[str, Any]) -> dict[str, int]:
    status = experiment.get("status") or {}
    return {str(i.get("severity")): int(i.get("count") or 0) for i in status.get("messageSeverityCounts") or []}


def rollup_parts(counts: Mapping[str, int]) -> list[tuple[str, str, str]]:
    """``[(text, style, state)]``: ``"3✓"`` per state with units, in display order (the compact bar)."""
    ordered = sorted((s for s, n in counts.items() if n), key=lambda s: (ORDER.get(s, 99), s))
    return [(f"{counts[s]}{GLYPH.get(s, '?')}", style_of(s), s) for s in ordered]


def rollup_text(counts: Mapping[str, int]) -> str:
    return " ".join(text for text, _, _ in rollup_parts(counts)) or "—"


def xid_of(name: str) -> int:
    """``experiments/12`` -> 12 (also the work unit and execution forms)."""
    parts = str(name).split("/")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def last_id(name: str) -> int:
    tail = str(name or "").rpartition("/")[2]
    return int(tail) if tail.isdigit() else 0


def when(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of proto3 JSON (``2026-12-01T21:40:03.123456Z``) as an aware datetime."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip().replace("Z", "+00:00")
    if "." in text:  # Python < 3.11 takes at most 6 fractional digits
        head, _, rest = text.partition(".")
        digits = "".join(c for c in rest if c.isdigit())
        text = f"{head}.{digits[:6].ljust(6, '0')}{rest[len(digits):]}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def now() -> datetime:
    return datetime.now(timezone.utc)


def short(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def duration(start: Any, end: Any = None) -> str:
    begin = when(start)
    if begin is None:
        return ""
    return short((when(end) or now()) - begin)


def created(value: Any, reference: datetime | None = None) -> str:
    """A compact creation time: ``14:05`` today, ``Nov 30`` this year, else ``2025-11-30``."""
    moment = when(value)
    if moment is None:
        return ""
    local, ref = moment.astimezone(), (reference or now()).astimezone()
    if local.date() == ref.date():
        return local.strftime("%H:%M")
    if local.year == ref.year:
        return local.strftime("%b %d")
    return local.strftime("%Y-%m-%d")


# --- Arguments and sweeps ------------------------------------------------------------------------


def args_of(work_unit: Mapping[str, Any]) -> dict[str, str]:
    """A work unit's arguments as ``name -> text`` (keyed args, then positional ``$1``...; ``job.`` prefix
    when the JobSet has several jobs)."""
    jobs = ((work_unit.get("executable") or {}).get("jobset") or {}).get("jobs") or []
    result: dict[str, str] = {}
    for job in jobs:
        spec = job.get("spec") or {}
        prefix = f"{job.get('name', '')}." if len(jobs) > 1 else ""
        for key, value in sorted((spec.get("args") or {}).items()):
            result[f"{prefix}{key}"] = str(value)
        for i, value in enumerate(spec.get("argsList") or [], start=1):
            result[f"{prefix}${i}"] = str(value)
    return result


def differing(all_args: Sequence[Mapping[str, str]]) -> list[str]:
    """The argument names whose values differ across the work units (the sweep's columns), in first-seen order."""
    names: list[str] = []
    for args in all_args:
        names.extend(n for n in args if n not in names)
    return [n for n in names if len({a.get(n, "∅") for a in all_args}) > 1]


# --- Messages and why -----------------------------------------------------------------------------


def _text(message: Mapping[str, Any] | None) -> str:
    return str((message or {}).get("userFacingText") or "").strip()


def _url(message: Mapping[str, Any] | None) -> str:
    url = str(((message or {}).get("userFacingUrl") or {}).get("url") or "").strip()
    return url if url.startswith(("http://", "https://")) else ""


def last_message(work_unit: Mapping[str, Any]) -> str:
    """The execution's most telling message: the user's, else the system's, else the scheduling information."""
    status = (work_unit.get("currentWorkUnitExecution") or {}).get("status") or {}
    for key in ("userMessage", "systemMessage", "schedulingInformation"):
        text = _text(status.get(key))
        if text:
            return text
    return ""


def sentence_of(work_unit: Mapping[str, Any]) -> str:
    """The server's sentence of why the unit is not running (``main.with_headlines`` puts it on the unit), as is;
    from an older server without ``sentence``, its ``headline``; "" from one without the endpoint."""
    return str(work_unit.get("sentence") or work_unit.get("headline") or "")


def headline_of(work_unit: Mapping[str, Any]) -> str:
    """The message column: the server's sentence, else (a unit that runs) the most telling message."""
    return sentence_of(work_unit) or last_message(work_unit)


def one_line(text: str, width: int = 0) -> str:
    flat = " ".join(text.split())
    return flat if not width or len(flat) <= width else flat[: max(1, width - 1)] + "…"


def _failed_condition(status: Mapping[str, Any]) -> dict[str, Any]:
    jobset = ((status.get("detailedStatus") or {}).get("jobsetStatus") or {})
    for condition in jobset.get("conditions") or []:
        if condition.get("type") == "Failed" and str(condition.get("status")).lower() == "true":
            return dict(condition)
    return {}


def why(work_unit: Mapping[str, Any], messages: Iterable[Mapping[str, Any]] = ()) -> list[str]:
    """Plain lines: the state and for how long, the server's sentence of why the unit is not running or
    why it failed (`sentence_of`: this client words no reason of its own), then the details it reads.

    The details: the scheduler's words (queue position of N), the JobSet's
    Failed condition and failed jobs, the system message (eviction reason,
    image pull error with its pod, OOM, lost node: the reconciler writes them
    in words) and the job's, and the newest status message with its link.
    """
    execution = work_unit.get("currentWorkUnitExecution") or {}
    status = execution.get("status") or {}
    state = str(status.get("state") or "UNSPECIFIED")
    scheduling, system, user = status.get("schedulingInformation"), status.get("systemMessage"), status.get("userMessage")
    since = duration(status.get("stateUpdateTime") or status.get("updateTime"))
    eid = last_id(execution.get("name", ""))
    head = f"{state.replace('_', ' ').lower()}" + (f" for {since}" if since else "") + (f" (execution {eid})" if eid else "")
    said = sentence_of(work_unit)
    lines: list[str] = [said] if said else []
    if _text(scheduling) and state in ("SCHEDULING", "STARTING", "DESCHEDULING"):
        lines.append(f"Scheduler: {_text(scheduling)}")
    if state in ("FAILED", "PARTIALLY_FAILED"):
        condition = _failed_condition(status)
        message, reason = str(condition.get("message") or "").strip(), str(condition.get("reason") or "").strip()
        if message or reason:
            lines.append("JobSet: " + message + (f" ({reason})" if reason and message else reason) + ".")
        jobs = ((status.get("detailedStatus") or {}).get("jobsetStatus") or {}).get("replicatedJobsStatus") or []
        failed_jobs = [f"{j.get('name')} {j.get('failed')} failed" for j in jobs if int(j.get("failed") or 0)]
        if failed_jobs:
            lines.append("Jobs: " + ", ".join(failed_jobs) + ".")
    if _text(system) and _text(system) not in " ".join(lines):
        lines.append(f"System: {_text(system)}" + (f"  <{_url(system)}>" if _url(system) else ""))
    if _text(user):
        lines.append(f"Job: {_text(user)}" + (f"  <{_url(user)}>" if _url(user) else ""))
    newest = next(iter(messages), None)
    if newest is not None:
        content = newest.get("content") or {}
        text = _text(content)
        if text and text not in " ".join(lines):
            severity = str(content.get("severity") or "").replace("SEVERITY_UNSPECIFIED", "").lower()
            lines.append(f"Last message{' (' + severity + ')' if severity else ''}: {text}"
                         + (f"  <{_url(content)}>" if _url(content) else ""))
    return [head[0].upper() + head[1:] + "."] + lines
