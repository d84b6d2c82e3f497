"""GetChartData's answer as the JSON the chart script draws with uPlot, and a LayoutSpec as grid cells.

Pure functions (no ORM, no request): ``ui.charts`` evaluates a chart through
the API's own GetChartData handler (or, for a work unit without charts, a
default plot through the same ``metrics.data.chart_data``) and hands the
``cloud.xmanager.v1.ChartData`` with the chart's ``PlotSpec`` list here.

What the script gets per plot (``kind``):

* ``lines``: uPlot's columnar shape -- one shared ``x`` (steps, or unix
  seconds when the plot maps x to time) and per series ``y`` aligned to it
  (``null`` where a series has no point), plus ``lo`` / ``hi`` when the points
  are buckets (min and max of a downsampled bucket, or a MEAN_CI_95 interval)
  so a band can be drawn; a ``style`` from the geoms (`_style`: line, points,
  area, bars, ribbon); reference lines from HLINE / VLINE geoms;
* ``bars``: categories (work units, aggregates or histogram bins) and one
  series of values per metric;
* ``summary``: rows of latest / min / max / mean, shown as a table.

Every label is a string the script prints with ``textContent``: titles and
metric names are whatever users wrote.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from core import pb
from metrics.specs import ARG_MAPPING

M = pb.dashboard
_SCALES = {M.CoordSpec.LOG: "log", M.CoordSpec.SYMLOG: "symlog"}
#: Widths the script may ask for (the chart's plot area in CSS pixels).
MIN_WIDTH, MAX_WIDTH = 50, 4000


def width_of(text: str | None, default: int = 600) -> int:
    """The ``width`` query parameter, clamped to what a screen can show."""
    if not text or not (text.isascii() and text.isdigit()) or len(text) > 6:
        return default
    return max(MIN_WIDTH, min(MAX_WIDTH, int(text)))


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN or infinities


def unit_label(wid: int | str, units: Mapping[int, str]) -> str:
    """A work unit as a legend names it: ``wu 3 · trainer`` (its job name when known)."""
    job = units.get(int(wid), "")
    return f"wu {wid} · {job}" if job else f"wu {wid}"


def _series_label(metric: str, label: str, several: bool, one_metric: bool, units: Mapping[int, str]) -> str:
    if not several:
        return metric
    who = unit_label(label, units) if (label.isascii() and label.isdigit()) else label or "(all)"
    return who if one_metric and label else f"{metric} · {who}"


#: A SUMMARY entry over an experiment names its work unit in its metric name (``metrics.data.summary_label``).
_SUMMARY_OF_UNIT = re.compile(r"^(?P<metric>.*) · wid (?P<wid>[0-9]+)$", re.DOTALL)


def scope_of(plots: Sequence[Any]) -> str:
    """"experiment" when a plot maps colour or group to the work unit or an argument (``work_unit``,
    ``arg.<name>``): such a plot compares units, so it is drawn over every work unit of the chart's
    experiment (GetChartData's ``parent_experiment``); else "work_unit", the chart's own."""
    for plot in plots:
        for value in (plot.mapping.color, plot.mapping.group):
            if value in ("work_unit", "wid") or ARG_MAPPING.fullmatch(value):
                return "experiment"
    return "work_unit"


def stored_scope(plots: Sequence[Mapping[str, Any]]) -> str:
    """`scope_of` for a chart's stored plots (proto3 JSON, as ``Chart.plots`` keeps them)."""
    return scope_of([json_format.ParseDict(plot, M.PlotSpec(), ignore_unknown_fields=True) for plot in plots or []])


def _lines(spec: Any, entries: Sequence[Any], units: Mapping[int, str]) -> dict[str, Any]:
    by_time = spec.mapping.x == "time"
    labels = {(e.scatter_series.metric_name, e.scatter_series.work_unit_id) for e in entries}
    several = len(labels) > 1
    one_metric = len({metric for metric, _ in labels}) == 1
    columns: list[dict[float, tuple[float, float, float]]] = []
    names = []
    for entry in entries:
        series = entry.scatter_series
        points: dict[float, tuple[float, float, float]] = {}
        for p in series.points:
            x = p.timestamp.seconds + p.timestamp.nanos / 1e9 if by_time else float(p.step)
            points[x] = (p.avg_value, p.min_value, p.max_value)
        columns.append(points)
        names.append((series.metric_name, series.work_unit_id))
    xs = sorted({x for points in columns for x in points})
    out_series = []
    for (metric, label), points in zip(names, columns):
        y = [_number(points[x][0]) if x in points else None for x in xs]
        banded = any(v[1] != v[2] for v in points.values())
        item: dict[str, Any] = {"label": _series_label(metric, label, several, one_metric, units), "metric": metric,
                                "wid": int(label) if (label.isascii() and label.isdigit()) else None, "y": y}
        if banded:
            item["lo"] = [_number(points[x][1]) if x in points else None for x in xs]
            item["hi"] = [_number(points[x][2]) if x in points else None for x in xs]
        out_series.append(item)
    geoms = {g.type for g in spec.geoms}
    return {
        "kind": "lines",
        "x": "time" if by_time else "step",
        "x_scale": _SCALES.get(spec.coords.x_scale, "linear"),
        "y_scale": _SCALES.get(spec.coords.y_scale, "linear"),
        "style": _style(geoms),
        "xs": [int(x) if not by_time else x for x in xs],
        "series": out_series,
        "hlines": [g.yintercept for g in spec.geoms if g.type == M.GeomSpec.HLINE],
        "vlines": [g.xintercept for g in spec.geoms if g.type == M.GeomSpec.VLINE],
        "points": sum(1 for s in out_series for v in s["y"] if v is not None),
    }


def _style(geoms: set[int]) -> str:
    """How the script draws a plot's series, from its geoms (HLINE / VLINE are drawn besides):
    ``bars`` (BAR), ``area`` (AREA: the line, filled below), ``ribbon`` (RIBBON alone: only the band
    between each bucket's min and max, no line; a series without a band is drawn as a line),
    ``points`` (POINT alone), else ``line``. A RIBBON beside a LINE is the default look: the line with
    its band."""
    G = M.GeomSpec
    drawn = geoms - {G.HLINE, G.VLINE, G.GEOM_TYPE_UNSPECIFIED}
    if G.BAR in drawn:
        return "bars"
    if G.AREA in drawn:
        return "area"
    if drawn == {G.RIBBON}:
        return "ribbon"
    if drawn == {G.POINT}:
        return "points"
    return "line"


def _category(category: str, units: Mapping[int, str]) -> str:
    """A BAR category: ``wid 3`` (one bar per work unit) is named as the legends name units."""
    wid = category.removeprefix("wid ")
    return unit_label(wid, units) if category.startswith("wid ") and (wid.isascii() and wid.isdigit()) else category


def _bars(spec: Any, entries: Sequence[Any], units: Mapping[int, str]) -> dict[str, Any]:
    categories: list[str] = []
    values: dict[str, dict[str, float]] = {}
    for entry in entries:
        bar = entry.bar_data
        for bucket in bar.buckets:
            category = _category(bucket.category_or_bin, units)
            if category not in categories:
                categories.append(category)
            values.setdefault(bar.metric_name, {})[category] = bucket.value_or_count
    series = [{"label": metric, "metric": metric, "y": [_number(by.get(c, math.nan)) for c in categories]}
              for metric, by in values.items()]
    return {"kind": "bars", "histogram": spec.type == M.HISTOGRAM, "categories": categories, "series": series,
            "y_scale": _SCALES.get(spec.coords.y_scale, "linear"),
            "points": sum(1 for s in series for v in s["y"] if v is not None)}


def _summary(entries: Sequence[Any], units: Mapping[int, str]) -> dict[str, Any]:
    rows = []
    for entry in entries:
        s = entry.summary_data
        of_unit = _SUMMARY_OF_UNIT.match(s.metric_name)
        rows.append({"metric": of_unit.group("metric") if of_unit else s.metric_name,
                     "unit": unit_label(of_unit.group("wid"), units) if of_unit else "", "latest": _number(s.latest_value), "min": _number(s.min_value),
                     "max": _number(s.max_value), "mean": _number(s.mean_value), "step": s.latest_step,
                     "time": s.latest_timestamp.ToJsonString() if s.HasField("latest_timestamp") else ""})
    return {"kind": "summary", "rows": rows, "points": len(rows), "units": any(r["unit"] for r in rows)}


def wids_of(data: Any) -> set[int]:
    """The work units a ``ChartData`` has entries of (series, bar categories, summaries)."""
    out: set[int] = set()
    for entry in data.plots_data:
        if entry.HasField("scatter_series") and (entry.scatter_series.work_unit_id.isascii() and entry.scatter_series.work_unit_id.isdigit()):
            out.add(int(entry.scatter_series.work_unit_id))
        elif entry.HasField("bar_data"):
            out.update(int(b.category_or_bin[4:]) for b in entry.bar_data.buckets
                       if b.category_or_bin.startswith("wid ") and (b.category_or_bin[4:].isascii() and b.category_or_bin[4:].isdigit()))
        elif entry.HasField("summary_data") and (found := _SUMMARY_OF_UNIT.match(entry.summary_data.metric_name)):
            out.add(int(found.group("wid")))
    return out


def chart_json(plots: Sequence[Any], data: Any, units: Mapping[int, str] | None = None) -> dict[str, Any]:
    """``{"plots": [...], "points": n}``: each of ``plots`` (``PlotSpec``) with its entries of ``data``;
    ``units`` (wid -> job name) names the work units in legends, categories and summaries."""
    units = units or {}
    by_plot: dict[str, list[Any]] = {}
    for entry in data.plots_data:
        by_plot.setdefault(entry.plot_id, []).append(entry)
    out = []
    for spec in plots:
        entries = by_plot.get(spec.plot_id, [])
        if spec.type == M.SUMMARY_BOX or spec.stats.type == M.StatSpec.SUMMARY:
            plot = _summary(entries, units)
        elif spec.type in (M.BAR, M.HISTOGRAM):
            plot = _bars(spec, entries, units)
        else:
            plot = _lines(spec, entries, units)
        plot["id"] = spec.plot_id
        plot["title"] = spec.title or ", ".join(spec.data.metrics)
        out.append(plot)
    return {"plots": out, "points": sum(p["points"] for p in out)}


def default_plot(*metrics: str, title: str = "") -> Any:
    """The plot a work unit without charts gets for each of its metrics: the metric by step (several
    metrics: one line each, on one plot)."""
    return M.PlotSpec(plot_id="default", title=title or ", ".join(metrics), type=M.SCATTER,
                      data=M.DataSpec(metrics=list(metrics)), mapping=M.MappingSpec(x="step"))


# --- Layout -------------------------------------------------------------------------------------

L = M.LayoutSpec
LAYOUTS = {L.GRID: "grid", L.WRAP: "wrap", L.SIDE_BY_SIDE: "side", L.STACKED: "stacked"}
#: Grid columns a page draws at most (a LayoutSpec may say up to 64).
MAX_COLUMNS = 6


@dataclass(frozen=True)
class Cell:
    """Where one item goes on a wide screen (1-based CSS grid lines; 0 = placed automatically)."""

    column: int = 0
    row: int = 0
    width: int = 1
    height: int = 1


@dataclass(frozen=True)
class Layout:
    kind: str  # "grid" | "wrap" | "side" | "stacked"
    columns: int
    cells: Mapping[str, Cell]


def message_json(message: Any) -> dict[str, Any]:
    """A message (a ``LayoutSpec``) as the proto3 JSON it is stored as."""
    return dict(json_format.MessageToDict(message))


def layout(spec: Mapping[str, Any] | None, items: Iterable[str]) -> Layout:
    """A LayoutSpec (proto3 JSON, as stored) for ``items`` (chart or plot ids, in order).

    GRID: ``columns`` columns (2 when unset) and each ``positions`` entry
    (``item_id``, ``x`` column and ``y`` row from 0, ``width`` and ``height`` in
    cells) places its item; WRAP: as many columns as fit; SIDE_BY_SIDE: the
    items in one row; STACKED: one column. Unset: a grid when ``columns`` is
    set, else WRAP. On a phone every layout is one column (ui.css).
    """
    spec = spec or {}
    ids = list(items)
    kind_name = str(spec.get("type") or "")
    kind = {"GRID": "grid", "WRAP": "wrap", "SIDE_BY_SIDE": "side", "STACKED": "stacked"}.get(kind_name, "")
    columns = int(spec.get("columns") or 0)
    if not kind:
        kind = "grid" if columns else "wrap"
    if kind == "side":
        columns = max(1, min(len(ids), MAX_COLUMNS))
    elif kind == "stacked":
        columns = 1
    else:
        columns = max(1, min(columns or 2, MAX_COLUMNS))
    cells: dict[str, Cell] = {}
    if kind == "grid":
        for position in spec.get("positions") or []:
            item = str(position.get("itemId") or "")
            if item.startswith("charts/"):
                item = item[len("charts/"):]
            if item not in ids or item in cells:
                continue
            x, y = int(position.get("x") or 0), int(position.get("y") or 0)
            width = max(1, min(int(position.get("width") or 1), columns))
            column = min(max(x, 0), columns - width) + 1
            cells[item] = Cell(column=column, row=max(y, 0) + 1, width=width,
                               height=max(1, min(int(position.get("height") or 1), 4)))
    return Layout(kind, columns, cells)
