"""The chart cards a page prints (``ui/_chart.html``): each one's title, data URL and place.

Used by ``ui.views.work_unit`` (the work unit page's Metrics section, and its System group:
the ``system/*`` series XMC records from the cluster's metrics) and
``ui.charts.dashboard``; the chart script (``ui/static/ui/charts.js``) finds
every ``figure[data-chart]`` and reads its ``data-src``.
"""
from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse

from metrics import system_names
from ui import plotdata, reads



def card(chart: dict[str, Any], cell: plotdata.Cell | None = None, *, where: bool = False,
         over_experiment: bool = False) -> dict[str, Any]:
    """What ``ui/_chart.html`` prints for one chart (its data URL, its grid cell on a dashboard).

    On a dashboard (``where``) the card names where its data comes from. The only chart of its
    experiment on a dashboard (``over_experiment``) stands for the experiment and is drawn over every
    work unit of it: such a dashboard compares experiments (``xdash create-dashboard --xids`` makes one
    "standard comparison chart" per experiment, stamped with work unit 1 because a Chart must name
    one), so each unit is a series. Several charts of one experiment were each made for their unit."""
    xid, wid = chart["xid"], chart["wid"]
    src = reverse("ui-chart-data", args=[xid, wid, chart["chart_id"]])
    return {
        "key": f"c-{chart['chart_id']}", "title": chart["title"], "description": chart.get("description", ""),
        "xid": xid, "wid": wid, "cell": cell or plotdata.Cell(),
        "src": src + "?" + urlencode({"over": "experiment"}) if over_experiment else src,
        "where": (f"{xid} · {chart.get('experiment__title') or '(untitled)'} / "
                  + ("every work unit" if over_experiment else f"wu {wid}")) if where else "",
        "href": reverse("ui-work-unit", args=[xid, wid]) if where else "",
        "edit": reverse("ui-chart-edit", args=[xid, wid, chart["chart_id"]]),
    }


def metric_card(xid: int, wid: int, metric: str | list[str], index: int, title: str = "",
                description: str = "", key: str = "m") -> dict[str, Any]:
    metrics = [metric] if isinstance(metric, str) else metric
    query = [("metric", m) for m in metrics] + ([("title", title)] if title else [])
    return {"key": f"{key}-{index}", "title": title or metrics[0], "description": description, "xid": xid, "wid": wid,
            "cell": plotdata.Cell(), "src": reverse("ui-metric-data", args=[xid, wid]) + "?" + urlencode(query),
            "where": "", "href": "", "edit": ""}


#: The System group (docs/architecture/system_metrics.md): its charts, in this order, when there are points.
_SYSTEM = (
    (system_names.GPU_UTILIZATION, "GPU utilisation (0-1, mean over its GPUs)"),
    (system_names.GPU_UTILIZATION + "/", "GPU utilisation per GPU"),
    (system_names.GPU_MEMORY_USED_BYTES, "GPU memory used (bytes)"),
    (system_names.CPU_USAGE_CORES, "CPU (cores)"),
    (system_names.MEMORY_WORKING_SET_BYTES, "Memory working set (bytes)"),
)


def system_cards(xid: int, wid: int, names: list[str]) -> list[dict[str, Any]]:
    """The System group's charts of the metrics ``names`` the newest execution has (per GPU: one chart)."""
    cards: list[dict[str, Any]] = []
    for metric, title in _SYSTEM:
        found = [n for n in names if n.startswith(metric)] if metric.endswith("/") else [n for n in names if n == metric]
        if found:
            cards.append(metric_card(xid, wid, found[:reads.MAX_OVERLAID], len(cards), title,
                                     "recorded by XMC from the cluster's metrics", key="s"))
    return cards


def work_unit_metrics(xid: int, wid: int) -> dict[str, Any]:
    """The work unit page's Metrics section: its charts and a default chart per metric (caller checked).

    ``metrics_key`` names what the section shows (its charts, or the metrics of its default charts):
    on each "metrics" event the section asks for its contents again with it (``?fragment=metrics&have=``)
    and is answered 204 (no swap) until a chart or a metric appears that it has none for."""
    rows = reads.work_unit_charts(xid, wid)
    every = reads.metric_names(xid, wid)
    names = [m for m in every if not m.startswith(system_names.PREFIX)]
    # Its stored charts first, then one chart per metric, always (a preset chart does not hide them).
    charts = [*(card(c) for c in rows), *(metric_card(xid, wid, m, i) for i, m in enumerate(names))]
    shown = ["charts", *(c["chart_id"] for c in rows), "metrics", *every]
    key = hashlib.sha256("\n".join(shown).encode()).hexdigest()[:16]
    return {"charts": charts, "default_charts": bool(names), "stored_charts": len(rows), "metrics_key": key,
            "system_charts": system_cards(xid, wid, [m for m in every if m.startswith(system_names.PREFIX)])}
