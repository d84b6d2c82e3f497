"""The versioned JSON payload of a message, and the Slack and email renderings of it.

Schema version 1 (docs/architecture/notifications.md, "Payload schema")::

    {"type": "workUnit.failed", "timestamp": "2026-12-01T02:00:00Z", "schemaVersion": 1,
     "data": {"experiment": {"name": "experiments/12", "title": "...", "url": "..."},
              "count": 3, "workUnits": [{"name": "experiments/12/workUnits/4", "executionId": 1,
                                         "state": "FAILED", "previousState": "RUNNING"}],
              "truncated": false}}

One message may carry many events of one experiment (coalescing): ``count``
says how many, ``workUnits`` lists the first :data:`MAX_LISTED`.
"""
from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings

from notifications.models import PAYLOAD_TYPE, Event, EventType

SCHEMA_VERSION = 1
#: The event types whose message lists work units.
UNIT_EVENTS = (EventType.WORK_UNIT_FAILED, EventType.WORK_UNIT_QUEUED_TOO_LONG, EventType.WORK_UNIT_IDLE)
MAX_LISTED = 10


def _time(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def page_path(xid: int, wid: int | None = None) -> str:
    """The researcher's page (never the REST resource), as a path: ``/experiments/<xid>`` and
    ``.../workUnits/<wid>``. Stored in the message so; :func:`linked` makes it a URL."""
    base = f"/experiments/{xid}"
    return base if wid is None else f"{base}/workUnits/{wid}"


def experiment_json(xid: int, title: str = "") -> dict[str, Any]:
    return {"name": f"experiments/{xid}", "title": title, "path": page_path(xid)}


def linked(body: str) -> str:
    """The stored body as it is sent: every ``path`` becomes a ``url`` on the origin configured
    now (``XMANAGER_UI_URL``). A message is stored when first built and re-sent as stored; with
    the link kept as a path it stays right when the system moves host or port between tries
    (issue 39). Bodies stored with a ``url`` (before this) are sent as they are."""
    payload = json.loads(body)
    data = payload.get("data") or {}
    for item in [data.get("experiment"), *(data.get("workUnits") or [])]:
        if isinstance(item, dict) and isinstance(item.get("path"), str):
            item["url"] = settings.XMC_UI_URL.rstrip("/") + item.pop("path")
    return dumps(payload)


#: What ``notifications.details.failure_details`` says of one failed execution, by (wid, eid).
Details = Mapping[tuple[int, int], Mapping[str, Any]]


def build(type_: str, events: Sequence[Event], now: datetime, details: Details | None = None) -> dict[str, Any]:
    """The payload of one message carrying ``events`` (all of one type, one experiment or none);
    ``details`` add the job name, differing args, reason and last line of failed units."""
    events = sorted(events, key=lambda e: e.id)
    data: dict[str, Any] = {}
    # An "experiment finished" message may carry the failures it follows (fan-out folds an open
    # failure message into it, so the summary never arrives before them): those are listed.
    own = [e for e in events if e.type == type_] or events
    first = own[0] if own else None
    if first is not None and first.xid is not None:
        data["experiment"] = experiment_json(first.xid, str(first.data.get("title", "")))
    units = [e for e in events if e.type in UNIT_EVENTS]
    if type_ in UNIT_EVENTS or units:
        data["count"] = len(units)
        data["workUnits"] = [
            {"name": f"experiments/{e.xid}/workUnits/{e.wid}", "executionId": e.eid,
             "state": e.data.get("state", ""), "previousState": e.data.get("previousState", ""),
             **({"path": page_path(e.xid, e.wid)} if e.xid is not None and e.wid is not None else {}),
             **({"queuedMinutes": e.data["queuedMinutes"]} if "queuedMinutes" in e.data else {}),
             **{k: e.data[k] for k in ("gpus", "idleSeconds", "message") if k in e.data},
             **{k: v for k, v in (details or {}).get((e.wid or 0, e.eid or 0), {}).items() if v}}
            for e in units[:MAX_LISTED]]
        data["truncated"] = len(units) > MAX_LISTED
    if type_ == EventType.EXPERIMENT_FINISHED and first is not None:
        data["activeState"] = "INACTIVE"
        data["stateCounts"] = dict(sorted(first.data.get("stateCounts", {}).items()))
    elif type_ in (EventType.SCHEDULING_PAUSED, EventType.SCHEDULING_RESUMED) and first is not None:
        data["paused"] = type_ == EventType.SCHEDULING_PAUSED
        data["changedBy"] = first.data.get("by", "")
        data["reason"] = first.data.get("reason", "")
    elif type_ == EventType.OPERATOR_DELIVERY_DEGRADED and first is not None:
        data["queue"] = first.data.get("queue", "")
        data["oldestPendingSeconds"] = first.data.get("oldestPendingSeconds", 0)
        data["since"] = first.data.get("since", "")
    elif type_ == EventType.TEST:
        data["message"] = "a test event from XMC"
    return {"type": PAYLOAD_TYPE[EventType(type_)], "timestamp": _time(now), "schemaVersion": SCHEMA_VERSION,
            "data": data}


def dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True)


def title(payload: dict[str, Any]) -> str:
    data = payload.get("data", {})
    name = data.get("experiment", {}).get("name", "")
    label = data.get("experiment", {}).get("title") or name
    kind = payload.get("type")
    if kind == "workUnit.failed":
        n = data.get("count", 0)
        units = data.get("workUnits") or []
        reason = f": {units[0]['reason']}" if n == 1 and units and units[0].get("reason") else ""
        return f"{n} work unit{'s' if n != 1 else ''} failed in {label}{reason}"
    if kind == "workUnit.queuedTooLong":
        return f"{data.get('count', 0)} work unit(s) of {label} waiting in the queue"
    if kind == "workUnit.idle":
        units = data.get("workUnits") or []
        n = data.get("count", 0)
        what = f": {units[0]['message']}" if n == 1 and units and units[0].get("message") else ""
        return f"{n} work unit{'s' if n != 1 else ''} of {label} idle{what}"
    if kind == "experiment.finished":
        failed = (data.get("stateCounts") or {}).get("FAILED", 0)
        return f"{label} finished" + (f", {failed} work unit{'s' if failed != 1 else ''} failed" if failed else "")
    if kind == "scheduling.paused":
        return f"Scheduling paused by {data.get('changedBy', '')}"
    if kind == "scheduling.resumed":
        return f"Scheduling resumed by {data.get('changedBy', '')}"
    if kind == "operator.deliveryDegraded":
        minutes = int(data.get("oldestPendingSeconds", 0)) // 60
        return f"Work is waiting for a worker on the {data.get('queue', '')} queue: oldest {minutes} min"
    return "XMC test notification"


#: Plain-text lines are wrapped to this width (a phone's mail app shows ~40-70 characters).
WRAP = 68


def _unit_label(wu: Mapping[str, Any]) -> str:
    wid = str(wu.get("name", "")).rsplit("/", 1)[-1]
    job = wu.get("jobName") or ""
    return f"{job} (work unit {wid})" if job else f"work unit {wid}"


def _unit_lines(wu: Mapping[str, Any]) -> list[str]:
    """What the reader needs of one work unit, most useful first (no URL: the caller links)."""
    lines = []
    if wu.get("args"):
        lines.append(", ".join(f"{k}={v}" for k, v in wu["args"].items()))
    if wu.get("reason"):
        lines.append(str(wu["reason"]))
    elif wu.get("message"):
        lines.append(str(wu["message"]))
    elif wu.get("queuedMinutes"):
        lines.append(f"waiting in the queue for more than {wu['queuedMinutes']} min")
    elif wu.get("state"):
        lines.append(f"{wu.get('previousState') or '?'} → {wu['state']}")
    if wu.get("lastLogLine"):
        lines.append(f"last line: {wu['lastLogLine']}")
    return lines


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WRAP, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=True, break_on_hyphens=False) or [indent]


def text(payload: dict[str, Any]) -> str:
    """Plain text (the email body), readable on a phone: short wrapped lines, the title, each
    work unit with its job, differing args, reason, last line and page link, the counts, the
    experiment's page last. URLs stay whole (a mail app links them)."""
    data = payload.get("data", {})
    lines = [*_wrap(title(payload), ""), ""]
    if "stateCounts" in data:
        lines += [f"  {state.lower()}: {count}" for state, count in data["stateCounts"].items()]
        lines.append("")
    for wu in data.get("workUnits", []):
        lines += _wrap(f"• {_unit_label(wu)}", "")
        for line in _unit_lines(wu):
            lines += _wrap(line, "  ")
        if wu.get("url"):
            lines.append(f"  {wu['url']}")
        lines.append("")
    if data.get("truncated"):
        lines += [f"... and {data['count'] - len(data['workUnits'])} more", ""]
    if data.get("reason"):
        lines += [*_wrap(f"reason: {data['reason']}", ""), ""]
    if "experiment" in data:
        lines += ["Open the experiment:", data["experiment"]["url"], ""]
    lines += [f"({payload['type']}, {payload['timestamp']})"]
    return "\n".join(lines) + "\n"


def slack_escape(value: str) -> str:
    """Text for Slack's ``mrkdwn`` (and the ``text`` fallback), escaped by Slack's rules: ``&``,
    ``<`` and ``>`` as ``&amp;``, ``&lt;``, ``&gt;``, so a title cannot mention ``<!channel>``,
    ``<@U123>`` or hide a link as ``<http://x|disguised>``."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack(payload: dict[str, Any]) -> dict[str, Any]:
    """Slack Block Kit message, one short block each (a phone shows them stacked): a header
    (title), the counts, one section per work unit (a link to its page, differing args, reason,
    last line), a button to the experiment's page.

    Everything in ``mrkdwn`` and the ``text`` fallback is escaped (:func:`slack_escape`); the
    header is ``plain_text``, which Slack shows as written."""
    data = payload.get("data", {})
    fields = []
    if "count" in data:
        fields.append({"type": "mrkdwn", "text": f"*Count*\n{data['count']}"})
    if "stateCounts" in data:
        fields += [{"type": "mrkdwn", "text": f"*{slack_escape(str(state)).lower()}*\n{count}"}
                   for state, count in data["stateCounts"].items()]
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title(payload)[:150]}}]
    if fields:
        blocks.append({"type": "section", "fields": fields[:10]})
    for wu in data.get("workUnits", []):
        label = slack_escape(_unit_label(wu))
        head = f"*<{slack_escape(wu['url'])}|{label}>*" if wu.get("url") else f"*{label}*"
        body = [slack_escape(line) for line in _unit_lines(wu)]
        section = "\n".join([head, *body])
        if len(section) > 2900:  # Slack's limit is 3000; never cut an entity in half
            section = re.sub(r"&[a-z]*$", "", section[:2900])
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": section}})
    extra = []
    if data.get("truncated"):
        extra.append(f"… and {data['count'] - len(data['workUnits'])} more")
    if data.get("reason"):
        extra.append(f"reason: {data['reason']}")
    if data.get("message"):
        extra.append(str(data["message"]))
    if extra:
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                     "text": slack_escape("\n".join(extra))[:2900]}})
    if "experiment" in data:
        blocks.append({"type": "actions", "elements": [{"type": "button", "text": {"type": "plain_text",
                       "text": "Open experiment"}, "url": data["experiment"]["url"]}]})
    return {"text": slack_escape(title(payload)), "blocks": blocks[:50]}
