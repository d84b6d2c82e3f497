"""Charts on the researcher's pages: the data endpoints the chart script reads, and the dashboard pages.

Thin views, as ``ui.views`` are. The data of a chart is the API's own
GetChartData: the views call the DashboardService handlers through
``xmc.api.registry.invoke`` with the session's `Identity`, so the access
check (permission first, ``xmc.api.access``: a stranger's chart reads as a
missing one, 404 here) and the evaluation (``metrics.data.chart_data``:
downsampled in SQL to the width the script asks for) are exactly the API's.
A work unit without charts gets one default chart per metric of its newest
execution, evaluated by the same ``metrics.data.chart_data`` after the
page's own read check (``ui.reads.metric_chart_data``). ``ui.plotdata``
turns the answer into the JSON the script
(``ui/static/ui/charts.js``) draws with the vendored uPlot.

* ``GET .../workUnits/<wid>/charts/<chart_id>/data?width=[&over=experiment]`` (`chart_data`)
* ``GET .../workUnits/<wid>/metrics/data?metric=&width=`` (`metric_data`)
* ``GET /dashboards`` (`dashboards`), ``GET /dashboards/<id>`` (`dashboard`)

Live: the pages' event stream (``?metrics=1``) carries a ``metrics`` event
when a work unit has new points (``ui.live.publish_metrics``); the script
reads the charts of that work unit again.
"""
from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from core import pb
from core.errors import InvalidArgument, NotFound, PermissionDenied
from ui import chart_cards, live, plotdata, reads
from ui.views import _ids, signed_in
from xmc.api import registry
from xmc.auth.identity import Identity

D = pb.dashboard_api


def _json(body: dict[str, Any], status: int = 200) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    return response


def _invoke(method: str, request: Any, identity: Identity) -> Any:
    return registry.invoke(registry.DASHBOARDS, method, request, registry.Caller(identity))


@require_GET
@signed_in
def chart_data(request: HttpRequest, identity: Identity, xid: str, wid: str, chart_id: str) -> HttpResponse:
    """One chart's plots evaluated at the script's width: GetChart and GetChartData, as the API answers them."""
    x, w = _ids(xid, wid)
    name = f"experiments/{x}/workUnits/{w}/charts/{chart_id}"
    width = plotdata.width_of(request.GET.get("width"))
    try:
        chart = _invoke("GetChart", D.GetChartRequest(name=name), identity)
        # A chart that compares units (colour or group by work unit or argument), or one drawn on a
        # dashboard (``over=experiment``, `ui.chart_cards.card`), is over every unit of its experiment.
        every = plotdata.scope_of(chart.plots) == "experiment" or request.GET.get("over") == "experiment"
        over = f"experiments/{x}" if every else ""
        data = _invoke("GetChartData", D.GetChartDataRequest(name=name, chart_width_pixels=width,
                                                             parent_experiment=over), identity)
    except (NotFound, PermissionDenied):
        return _json({"error": "not found"}, 404)
    except InvalidArgument as exc:
        return _json({"error": str(exc)}, 400)
    layout = plotdata.layout(plotdata.message_json(chart.plot_layout), [p.plot_id for p in chart.plots])
    units = reads.job_names(x, plotdata.wids_of(data))
    return _json({"name": name, "width": width, "layout": _layout_json(layout), "scope": "experiment" if over
                  else "work_unit", **plotdata.chart_json(chart.plots, data, units)})


@require_GET
@signed_in
def metric_data(request: HttpRequest, identity: Identity, xid: str, wid: str) -> HttpResponse:
    """The default chart of one metric of a work unit (or of several, ``metric`` repeated, on one plot,
    titled ``title``): its newest execution's points by step."""
    x, w = _ids(xid, wid)
    metrics = request.GET.getlist("metric") or [""]
    width = plotdata.width_of(request.GET.get("width"))
    try:
        plot, data = reads.metric_chart_data(identity, x, w, metrics, width, request.GET.get("title", ""))
    except (NotFound, PermissionDenied):
        return _json({"error": "not found"}, 404)
    except InvalidArgument as exc:
        return _json({"error": str(exc)}, 400)
    layout = plotdata.layout({}, [plot.plot_id])
    return _json({"name": f"experiments/{x}/workUnits/{w}", "width": width, "layout": _layout_json(layout),
                  **plotdata.chart_json([plot], data)})


def _layout_json(layout: plotdata.Layout) -> dict[str, Any]:
    return {"kind": layout.kind, "columns": layout.columns,
            "cells": {item: vars(cell) for item, cell in layout.cells.items()}}


@require_GET
@signed_in
def dashboards(request: HttpRequest, identity: Identity) -> HttpResponse:
    """The caller's dashboards and those shared with them."""
    return render(request, "ui/dashboards.html", {"rows": reads.dashboards(identity), "me": identity.email})


@require_GET
@signed_in
def dashboard(request: HttpRequest, identity: Identity, dashboard_id: str) -> HttpResponse:
    """One dashboard, its charts laid out per its LayoutSpec (one that cannot be read is the 404 page)."""
    view = reads.dashboard(identity, dashboard_id)
    layout = plotdata.layout(view.layout, [c["chart_id"] for c in view.charts])
    per_experiment = Counter(c["xid"] for c in view.charts)
    cards = [chart_cards.card(c, layout.cells.get(c["chart_id"]), where=True, over_experiment=per_experiment[c["xid"]] == 1)
             for c in view.charts]
    xids = sorted({c["xid"] for c in view.charts})
    events_url = reverse("ui-experiments-events") + "?" + urlencode(
        {"x": ",".join(str(x) for x in xids), "metrics": "1", "since": live.top_id()})
    return render(request, "ui/dashboard.html", {
        "dashboard": view.message, "dashboard_id": dashboard_id, "charts": cards, "hidden": view.hidden,
        "layout": layout, "events_url": events_url, "layout_words": _LAYOUT_WORDS[layout.kind],
    })


_LAYOUT_WORDS = {"grid": "grid", "wrap": "wrapped", "side": "side by side", "stacked": "stacked"}
