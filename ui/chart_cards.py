"""The chart cards a page prints (``ui/_chart.html``): each one's title, data URL and place.

Used by ``ui.views.work_unit`` (the work unit page's Metrics section) and
``ui.charts.dashboard``; the chart script (``ui/static/ui/charts.js``) finds
every ``figure[data-chart]`` and reads its ``data-src``.
"""
from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse

from ui import plotdata, reads


def card(chart: dict[str, Any], cell: plotdata.Cell | None = None, *, where: bool = False) -> dict[str, Any]:
    """What ``ui/_chart.html`` prints for one chart (its data URL, its grid cell on a dashboard).

    On a dashboard (``where``) a chart is drawn over every work unit of its experiment: a dashboard
    compares experiments (``xdash create-dashboard --xids`` makes one "standard comparison chart" per
    experiment, stamped with work unit 1 because a Chart must name one), so each unit is a series."""
    xid, wid = chart["xid"], chart["wid"]
    src = reverse("ui-chart-data", args=[xid, wid, chart["chart_id"]])
    return {
        "key": f"c-{chart['chart_id']}", "title": chart["title"], "description": chart.get("description", ""),
        "xid": xid, "wid": wid, "cell": cell or plotdata.Cell(),
        "src": src + "?" + urlencode({"over": "experiment"}) if where else src,
        "where": f"{xid} · {chart.get('experiment__title') or '(untitled)'} / every work unit" if where else "",
        "href": reverse("ui-work-unit", args=[xid, wid]) if where else "",
        "edit": reverse("ui-chart-edit", args=[xid, wid, chart["chart_id"]]),
    }


def metric_card(xid: int, wid: int, metric: str, index: int) -> dict[str, Any]:
    return {"key": f"m-{index}", "title": metric, "description": "", "xid": xid, "wid": wid, "cell": plotdata.Cell(),
            "src": reverse("ui-metric-data", args=[xid, wid]) + "?" + urlencode({"metric": metric}),
            "where": "", "href": "", "edit": ""}


def work_unit_metrics(xid: int, wid: int) -> dict[str, Any]:
    """The work unit page's Metrics section: its charts and a default chart per metric (caller checked).

    ``metrics_key`` names what the section shows (its charts, or the metrics of its default charts):
    on each "metrics" event the section asks for its contents again with it (``?fragment=metrics&have=``)
    and is answered 204 (no swap) until a chart or a metric appears that it has none for."""
    rows = reads.work_unit_charts(xid, wid)
    names = reads.metric_names(xid, wid)
    # Its stored charts first, then one chart per metric, always (a preset chart does not hide them).
    charts = [*(card(c) for c in rows), *(metric_card(xid, wid, m, i) for i, m in enumerate(names))]
    shown = ["charts", *(c["chart_id"] for c in rows), "metrics", *names]
    key = hashlib.sha256("\n".join(shown).encode()).hexdigest()[:16]
    return {"charts": charts, "default_charts": bool(names), "stored_charts": len(rows), "metrics_key": key}
