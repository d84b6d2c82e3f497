"""The compare view: selected work units (or all that match the table's filter) side by side.

``GET /experiments/<xid>/compare?wid=1&wid=4`` (or ``?all=1&filter=...``), `compare`: overlaid curves
of a metric (one line per unit, or per value of an argument: the mean with a min-max band), with
exponential smoothing; a parallel-coordinates plot of the arguments and metric summaries whose
brushing filters the table below it (``ui/static/ui/compare.js``, own canvas code); and with two
units, a diff of args, env, image, resources, tags and metric summaries, differences marked.

The curves are GetChartData's evaluation (``metrics.data.chart_data``, bucketed in SQL to the
chart's width, smoothing by its StatSpec) over exactly the selected units
(``metrics.data.Scope.wids``), served at ``.../compare/data`` (`compare_data`) for the chart script;
the grouping (`group_series`) is done here on what it returns. Permission first, as every page
(``ui.reads.role``). At most `MAX_COMPARE` units are compared, and the page says so when more match.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from core import pb
from core.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from metrics import data as chart_data
from metrics import specs, summaries
from ui import plotdata, present, reads, study_reads
from ui.views import _ids, signed_in
from workunits import arguments
from xmc.api import importance as param_importance
from xmc.auth.identity import Identity

M = pb.dashboard
#: Work units one compare view shows at most (the overlay draws a line each).
MAX_COMPARE = 100


def _selection(xid: int, get: Any) -> tuple[list[int], int]:
    """(the wids to compare, how many the selection named or matched in all)."""
    if get.get("all") == "1":
        query = reads.UnitQuery(filter=get.get("filter", "")[:2000], size=MAX_COMPARE)
        page = reads.unit_page(xid, query)
        return [row["wid"] for row in page.rows], page.total
    wids = sorted({int(w) for w in get.getlist("wid") if (w.isascii() and w.isdigit()) and len(w) <= 18})
    return wids[:MAX_COMPARE], len(wids)


def _smooth(text: str | None) -> float:
    try:
        value = float(text or 0)
    except ValueError:
        return 0.0
    return min(0.99, max(0.0, value)) if math.isfinite(value) else 0.0


def overlay_plot(metric: str, smooth: float) -> Any:
    """The plot GetChartData evaluates for the overlay: the metric by step, per unit, smoothed when asked
    (exponential, ``alpha = 1 - smooth``: 0 is none, 0.9 is heavy)."""
    plot = M.PlotSpec(plot_id="overlay", title=metric, type=M.SCATTER, data=M.DataSpec(metrics=[metric]),
                      mapping=M.MappingSpec(x="step", color="work_unit"))
    if smooth > 0:
        plot.stats.type = M.StatSpec.SMOOTH
        plot.stats.smooth.algorithm = M.StatSpec.SmoothConfig.EXPONENTIAL
        plot.stats.smooth.alpha = round(1 - smooth, 4)
    return plot


def group_series(plot: dict[str, Any], groups: Mapping[int, str], name: str) -> dict[str, Any]:
    """``plot`` (one ``lines`` plot of `ui.plotdata.chart_json`, a series per unit) with one series per
    value of argument ``name`` instead: at each x the mean of its units' values, ``lo``/``hi`` their
    minimum and maximum (the band)."""
    members: dict[str, list[list[float | None]]] = {}
    for series in plot["series"]:
        members.setdefault(f"{name}={groups.get(series['wid'], '')}", []).append(series["y"])
    out = []
    for label, ys in sorted(members.items()):
        mean, low, high = [], [], []
        for column in zip(*ys):
            values = [v for v in column if v is not None]
            mean.append(sum(values) / len(values) if values else None)
            low.append(min(values) if values else None)
            high.append(max(values) if values else None)
        item: dict[str, Any] = {"label": f"{label} (mean of {len(ys)})", "metric": plot["series"][0]["metric"],
                                "wid": None, "y": mean}
        if len(ys) > 1:
            item["lo"], item["hi"] = low, high
        out.append(item)
    return {**plot, "series": out, "points": sum(1 for s in out for v in s["y"] if v is not None)}


@require_GET
@signed_in
def compare_data(request: HttpRequest, identity: Identity, xid: str) -> HttpResponse:
    """The overlay's data at the script's width (the chart script draws it as any chart)."""
    (x,) = _ids(xid)
    try:
        reads.role(identity, x)
    except (NotFound, PermissionDenied):
        return JsonResponse({"error": "not found"}, status=404)
    metric = request.GET.get("metric", "")
    if not specs.METRIC_PATTERN.fullmatch(metric):
        return JsonResponse({"error": str(InvalidArgument("metric must be 1 to 256 printable characters"))},
                        status=400)
    wids, _ = _selection(x, request.GET)
    width = plotdata.width_of(request.GET.get("width"))
    plot = overlay_plot(metric, _smooth(request.GET.get("smooth")))
    data = chart_data.chart_data(f"experiments/{x}", chart_data.Scope(x, None, tuple(wids) or (0,)), [plot], width)
    units = reads.unit_args(x, wids)
    body = plotdata.chart_json([plot], data, {w: u["job"] for w, u in units.items()})
    group = request.GET.get("group", "")[:256]
    if group:
        body["plots"] = [group_series(p, {w: u["args"].get(group, "") for w, u in units.items()}, group)
                         for p in body["plots"]]
        body["points"] = sum(p["points"] for p in body["plots"])
    response = JsonResponse({"name": f"experiments/{x}", "width": width,
                             "layout": {"kind": "wrap", "columns": 1, "cells": {}}, **body})
    response["Cache-Control"] = "no-store"
    return response


def diff_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Two units' (`unit_facts`) rows side by side: (section, name, value of a, value of b, differs)."""
    rows = []
    for section in ("args", "metrics", "env", "job"):
        left, right = a.get(section) or {}, b.get(section) or {}
        for name in sorted(set(left) | set(right)):
            one, two = left.get(name, ""), right.get(name, "")
            rows.append({"section": section, "name": name, "a": one, "b": two, "differs": one != two})
    return rows


def unit_facts(unit: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """What the diff compares of one unit: its args, env, job (image, resources, tags) and metric summaries."""
    executable = unit["executable"] or {}
    jobs = ((executable.get("jobset") or {}).get("jobs") or [])
    job: dict[str, str] = {"job name": arguments.job_name(executable), "tags": ", ".join(unit["tags"] or [])}
    for i, spec in enumerate(j.get("spec") or {} for j in jobs):
        prefix = f"{jobs[i].get('name')}." if len(jobs) > 1 else ""
        job[f"{prefix}image"] = str(spec.get("dockerImage") or spec.get("image") or "")
        job[f"{prefix}resources"] = json.dumps(spec.get("resources") or {}, sort_keys=True)
    return {
        "args": present.job_args(executable),
        "env": {f"{j}.{n}" if len(jobs) > 1 else n: v for j, n, v in present.job_env(executable)},
        "job": job,
        "metrics": {f"{name}.{stat}": present.number(getattr(s, stat)) for name, s in sorted(metrics.items())
                    for stat in ("last", "min", "max")},
    }


@require_GET
@signed_in
def compare(request: HttpRequest, identity: Identity, xid: str) -> HttpResponse:
    (x,) = _ids(xid)
    _, exp = reads.role(identity, x)
    error = ""
    try:
        wids, named = _selection(x, request.GET)
    except InvalidArgument as exc:
        wids, named, error = [], 0, str(exc)
    available = summaries.experiment_metrics(x)
    metric = request.GET.get("metric") or (available[0] if available else "")
    varying, _ = reads.sweep_args(x)
    group = request.GET.get("group", "") if request.GET.get("group", "") in varying else ""
    smooth = _smooth(request.GET.get("smooth"))
    rows = reads.units_in_order(x, wids, available[:10])
    table = [{"wid": r["wid"], "job": arguments.job_name(r["executable"]), "args": present.job_args(r["executable"]),
              "metrics": {m: s.last for m, s in r["metrics"].items()}} for r in rows]
    axes = [*({"name": a, "kind": "arg"} for a in varying), *({"name": m, "kind": "metric"} for m in available[:10])]
    parallel = {"axes": axes, "units": [{"wid": t["wid"], "values": [
        t["args"].get(a["name"], "") if a["kind"] == "arg" else t["metrics"].get(a["name"]) for a in axes]}
        for t in table]}
    diff = diff_rows(*(unit_facts(r, r["metrics"]) for r in rows)) if len(rows) == 2 else []
    params: list[tuple[str, str]] = [("wid", str(w)) for w in wids] if request.GET.get("all") != "1" else [
        ("all", "1"), ("filter", request.GET.get("filter", ""))]
    src = reverse("ui-compare-data", args=[x]) + "?" + urlencode(
        [*params, ("metric", metric), ("smooth", str(smooth)), ("group", group)])
    return render(request, "ui/compare.html", {
        "xid": x, "exp": exp, "wids": wids, "named": named, "capped": named > len(wids), "error": error,
        "metric": metric, "metrics": available, "group": group, "varying": varying, "smooth": smooth,
        "table": table, "table_metrics": available[:10], "parallel": parallel, "diff": diff,
        "params": params, "src": src, "max": MAX_COMPARE,
    })


@require_GET
@signed_in
def importance(request: HttpRequest, identity: Identity, xid: str) -> HttpResponse:
    """Parameter importance for a metric as bars (a fragment the experiment and study pages ask for when
    opened): the sweep read's ``xmc.api.importance.importance`` (Optuna's fANOVA over the completed units;
    with ``study=<sid>``, over that study's trials)."""
    (x,) = _ids(xid)
    metric, goal = request.GET.get("metric", "")[:256], request.GET.get("goal", "MINIMIZE")
    stat, study = request.GET.get("stat", "last")[:16], request.GET.get("study", "")
    wids = None
    if study:  # a study's page: over its trials only (ui.studies)
        if not (study.isascii() and study.isdigit() and len(study) <= 18):
            raise Http404("not found")
        wids = study_reads.trial_wids(study_reads.get_study(identity, x, int(study))[1])
    try:
        found = param_importance.importance(identity, x, metric=metric, goal=goal, stat=stat, wids=wids)
    except (InvalidArgument, FailedPrecondition) as exc:
        return render(request, "ui/_importance.html", {"error": str(exc), "metric": metric})
    bars = sorted(found.importances.items(), key=lambda item: (-item[1], item[0]))
    return render(request, "ui/_importance.html", {"bars": bars, "metric": metric, "goal": goal, "stat": stat,
                                                   "units": found.units, "study": bool(wids is not None)})
