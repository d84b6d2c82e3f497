"""Pure helpers that turn rows into what the pages print: words, durations, sweep columns, safe links.

No database, no request: ``ui.views`` calls them on what ``ui.reads`` returned,
and the tests call them on plain data.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from workunits import arguments, headline

#: The roll-up bar's order and each state's colour class (ui/static/ui/ui.css).
STATE_ORDER = ("RUNNING", "STARTING", "SCHEDULING", "INITIALIZING", "RESTARTING", "SCHEDULING_PAUSED",
               "DESCHEDULING", "PARTIALLY_FAILED", "STOPPING", "COMPLETED", "FAILED", "STOPPED")
TERMINAL = frozenset({"COMPLETED", "FAILED", "STOPPED"})


def safe_url(value: Any) -> str:
    """``value`` if it is an absolute http(s) URL, else "" (no ``javascript:``, ``data:``, relative tricks)."""
    if not isinstance(value, str) or len(value) > 4096:
        return ""
    text = value.strip()
    try:
        parts = urlsplit(text)
    except ValueError:
        return ""
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return ""
    if any(ord(c) < 0x20 or c in "\\" for c in text):
        return ""
    return text


def duration(start: datetime | None, end: datetime | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``; "" without a start."""
    if start is None or end is None:
        return ""
    seconds = max(0, int((end - start).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def words(state: str) -> str:
    return state.replace("_", " ").lower()


def rollup(counts: Mapping[str, int] | None) -> list[dict[str, Any]]:
    """The state roll-up bar: one segment per state with a count, in a fixed order, its offset and width in %."""
    counts = {k: int(v) for k, v in (counts or {}).items() if int(v or 0) > 0}
    total = sum(counts.values())
    if not total:
        return []
    ordered = [s for s in STATE_ORDER if s in counts] + sorted(set(counts) - set(STATE_ORDER))
    out, x = [], 0.0
    for state in ordered:
        pct = 100.0 * counts[state] / total
        out.append({"state": state, "count": counts[state], "x": round(x, 3), "pct": round(pct, 3),
                    "words": words(state)})
        x += pct
    return out


def text_of(message: Mapping[str, Any] | None) -> str:
    return str((message or {}).get("userFacingText") or "")


from workunits.eta import (  # noqa: E402,F401 - the pages' names for the estimate (workunits.eta owns it)
    ESTIMATE_MIN_ADMISSIONS, ESTIMATE_WINDOW_S, estimate_start, estimate_words, queue_position)


_ATTACHED = re.compile(r"\. Last lines of .* are attached$")


def failure_said(failure: str) -> Callable[[str], bool]:
    """Whether a message repeats the failure the page's "Why it failed" card already shows.

    The reconciler writes a failure's ERROR twice: first without, then with
    the last log lines ("... Last lines of X are attached"); both are the
    card's text. The messages list leaves them out: a thing is said once.
    """
    core = _ATTACHED.sub("", failure.strip())

    def said(text: str) -> bool:
        return bool(core) and _ATTACHED.sub("", text.strip()) == core

    return said


def why_not_running(state: str, current: Mapping[str, Any], queue_name: str, estimate: str = "") -> str:
    """The headline: why the work unit is not running, or why it failed, in one line.

    The server's one sentence, ``workunits.headline.describe`` (no UIDs, no
    pod names), the same ``xmc status`` and ``xmc why`` print; the details stay
    in the messages, shown once on the unit's page. ``estimate``
    (``workunits.eta.estimate_for``) is added to a queued unit's line.
    """
    return str(why(state, current, queue_name, estimate)["sentence"])


def why(state: str, current: Mapping[str, Any], queue_name: str, estimate: str = "") -> dict[str, Any]:
    """``{"headline", "sentence", "reason"}`` of an execution (``workunits.headline.describe``)."""
    return headline.describe(state, current.get("system_message"), current.get("scheduling_information"),
                             queue_name, estimate)


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def job_args(executable: Mapping[str, Any] | None) -> dict[str, str]:
    """A work unit's arguments as ``name -> value`` (every job's ``args`` and ``argsList``; job-prefixed if several)."""
    return arguments.flat_args(executable)


def job_env(executable: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """``(job, name, value)`` for every environment variable the jobs set."""
    out = []
    for job in (((executable or {}).get("jobset") or {}).get("jobs") or []):
        spec = job.get("spec") or {}
        for key, value in sorted((spec.get("envVars") or {}).items()):
            out.append((str(job.get("name") or ""), str(key), _scalar(value)))
        for item in spec.get("env") or []:
            value = item.get("value") if "value" in item else item.get("valueFrom", "")
            out.append((str(job.get("name") or ""), str(item.get("name") or ""), _scalar(value)))
    return out


def sweep(args_per_unit: Sequence[Mapping[str, str]]) -> tuple[list[str], dict[str, str]]:
    """(the argument names whose values differ across units, the arguments every unit shares)."""
    if not args_per_unit:
        return [], {}
    names: list[str] = []
    for args in args_per_unit:
        names.extend(n for n in args if n not in names)
    varying = [n for n in names if len({args.get(n) for args in args_per_unit}) > 1]
    shared = {n: args_per_unit[0][n] for n in names if n not in varying and n in args_per_unit[0]}
    return varying, shared


def goal(metric: str) -> str:
    """Which value of a metric column is best: "min" for names containing ``loss`` or ``error``, else "max"."""
    name = metric.lower()
    return "min" if "loss" in name or "error" in name else "max"


def number(value: float | None) -> str:
    """A metric value as the table prints it (4 significant digits; "" for none)."""
    if value is None:
        return ""
    return f"{value:.4g}"


def seconds(start: datetime | None, end: datetime | None) -> int | None:
    """Whole seconds from ``start`` to ``end`` (what a duration sorts and exports by); None without a start."""
    if start is None or end is None:
        return None
    return max(0, int((end - start).total_seconds()))


def queue_name(executable: Mapping[str, Any] | None) -> str:
    return str(((executable or {}).get("schedulingConstraints") or {}).get("queueName") or "")


def links(urls: Iterable[Mapping[str, Any]] | None) -> list[dict[str, str]]:
    """A ``Url`` list as links: only http(s) ones get an href; the name is shown as text."""
    out = []
    for item in urls or []:
        href = safe_url(item.get("url"))
        out.append({"href": href, "name": str(item.get("displayName") or item.get("url") or "link")})
    return out


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str) if value else ""
