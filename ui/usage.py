"""``/usage``: GPU- and CPU-hours by owner, experiment or queue over a period (`usage.services`).

Server-rendered like the other pages; the same query and figures as
``GET /v1/usage`` (docs/architecture/usage.md). Staff see everyone's usage,
anyone else their own. The period is picked as two UTC days, ``from`` and
``to`` (inclusive); the default is the last seven days.
"""
from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from core.errors import InvalidArgument
from core.identity import Identity
from usage import services
from ui.views import signed_in

_LABELS = {"owner": "Owner", "experiment": "Experiment", "queue": "Queue"}


def _day(value: str, name: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(f"{name} must be a date such as 2026-01-31 (got {value[:40]!r})", field=name) from None


def page_query(get: Any, today: date) -> tuple[services.Query, date, date]:
    """The usage query of the page's form: ``groupBy``, ``from``, ``to`` (UTC days), ``page``."""
    group_by = str(get.get("groupBy", "") or "owner")
    first = _day(get["from"], "from") if get.get("from") else today - timedelta(days=6)
    last = _day(get["to"], "to") if get.get("to") else today
    start = datetime.combine(first, time.min, tzinfo=timezone.utc)
    end = datetime.combine(last + timedelta(days=1), time.min, tzinfo=timezone.utc)
    params = {"groupBy": [group_by], "startTime": [start.isoformat()], "endTime": [end.isoformat()]}
    if get.get("page"):
        params["pageToken"] = [str(get["page"])[:20]]
    try:
        return services.parse_query(params), first, last
    except InvalidArgument as exc:
        if exc.field == "startTime":  # the page's names for the API's
            raise InvalidArgument("from must not be after to", field="from") from None
        raise


@require_GET
@signed_in
def usage_page(request: HttpRequest, identity: Identity) -> HttpResponse:
    today = datetime.now(timezone.utc).date()
    error = ""
    rows: list[dict[str, Any]] = []
    total = None
    next_url = ""
    group_by = str(request.GET.get("groupBy", "owner"))[:20]
    first, last = today - timedelta(days=6), today
    try:
        query, first, last = page_query(request.GET, today)
        group_by = query.group_by
        result = services.usage_of(identity, query)
        titles = services.experiment_titles([int(r.key) for r in result.rows]) if group_by == "experiment" else {}
        for row in result.rows:
            rows.append({
                "key": row.key, "title": titles.get(int(row.key), "") if group_by == "experiment" else "",
                "gpu_hours": row.gpu_hours, "gpu_hours_used": row.gpu_hours_used, "cpu_hours": row.cpu_hours,
                "executions": row.executions,
                "used_pct": round(100 * row.gpu_hours_used / row.gpu_hours) if row.gpu_hours else None,
            })
        total = result.total
        token = services.next_page_token(result, query.page_size)
        if token:
            next_url = "?" + urlencode({"groupBy": group_by, "from": first.isoformat(), "to": last.isoformat(),
                                        "page": token})
    except InvalidArgument as exc:
        error = str(exc)
    return render(request, "ui/usage.html", {
        "rows": rows, "total": total, "error": error, "group_by": group_by, "groupings": _LABELS,
        "label": _LABELS.get(group_by, "Owner"), "first": first, "last": last, "next_url": next_url,
        "everyone": identity.is_staff, "me": identity.email,
    })
