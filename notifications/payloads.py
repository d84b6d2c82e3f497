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
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings

from notifications.models import PAYLOAD_TYPE, Event, EventType

SCHEMA_VERSION = 1
MAX_LISTED = 10


def _time(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def experiment_json(xid: int, title: str = "") -> dict[str, Any]:
    return {"name": f"experiments/{xid}", "title": title,
            "url": f"{settings.XMC_PUBLIC_URL.rstrip('/')}/v1/experiments/{xid}"}


def build(type_: str, events: Sequence[Event], now: datetime) -> dict[str, Any]:
    """The payload of one message carrying ``events`` (all of one type, one experiment or none)."""
    events = sorted(events, key=lambda e: e.id)
    data: dict[str, Any] = {}
    first = events[0] if events else None
    if first is not None and first.xid is not None:
        data["experiment"] = experiment_json(first.xid, str(first.data.get("title", "")))
    if type_ in (EventType.WORK_UNIT_FAILED, EventType.WORK_UNIT_QUEUED_TOO_LONG):
        data["count"] = len(events)
        data["workUnits"] = [
            {"name": f"experiments/{e.xid}/workUnits/{e.wid}", "executionId": e.eid,
             "state": e.data.get("state", ""), "previousState": e.data.get("previousState", ""),
             **({"queuedMinutes": e.data["queuedMinutes"]} if "queuedMinutes" in e.data else {})}
            for e in events[:MAX_LISTED]]
        data["truncated"] = len(events) > MAX_LISTED
    elif type_ == EventType.EXPERIMENT_FINISHED and first is not None:
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
        return f"{n} work unit{'s' if n != 1 else ''} failed in {label}"
    if kind == "workUnit.queuedTooLong":
        return f"{data.get('count', 0)} work unit(s) of {label} waiting in the queue"
    if kind == "experiment.finished":
        return f"{label} finished"
    if kind == "scheduling.paused":
        return f"Scheduling paused by {data.get('changedBy', '')}"
    if kind == "scheduling.resumed":
        return f"Scheduling resumed by {data.get('changedBy', '')}"
    if kind == "operator.deliveryDegraded":
        minutes = int(data.get("oldestPendingSeconds", 0)) // 60
        return f"Work is waiting for a worker on the {data.get('queue', '')} queue: oldest {minutes} min"
    return "XMC test notification"


def text(payload: dict[str, Any]) -> str:
    """Plain text (email body): the title, the counts, the first work units, the link."""
    data = payload.get("data", {})
    lines = [title(payload), ""]
    if "stateCounts" in data:
        lines += [f"  {state}: {count}" for state, count in data["stateCounts"].items()]
    for wu in data.get("workUnits", []):
        lines.append(f"  {wu['name']} (execution {wu['executionId']}): {wu.get('previousState', '')} -> {wu['state']}")
    if data.get("truncated"):
        lines.append(f"  ... and {data['count'] - len(data['workUnits'])} more")
    if data.get("reason"):
        lines.append(f"  reason: {data['reason']}")
    if "experiment" in data:
        lines += ["", data["experiment"]["url"]]
    lines += ["", f"({payload['type']}, {payload['timestamp']})"]
    return "\n".join(lines) + "\n"


def slack(payload: dict[str, Any]) -> dict[str, Any]:
    """Slack Block Kit message: a header (title), a section (state and counts), a link."""
    data = payload.get("data", {})
    fields = []
    if "count" in data:
        fields.append({"type": "mrkdwn", "text": f"*Count*\n{data['count']}"})
    if "stateCounts" in data:
        fields += [{"type": "mrkdwn", "text": f"*{state}*\n{count}"} for state, count in data["stateCounts"].items()]
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title(payload)[:150]}}]
    detail = text(payload).split("\n", 2)[2].strip() if "\n" in text(payload) else ""
    if fields:
        blocks.append({"type": "section", "fields": fields[:10]})
    if detail:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": detail[:2900]}})
    if "experiment" in data:
        blocks.append({"type": "actions", "elements": [{"type": "button", "text": {"type": "plain_text",
                       "text": "Open experiment"}, "url": data["experiment"]["url"]}]})
    return {"text": title(payload), "blocks": blocks}
