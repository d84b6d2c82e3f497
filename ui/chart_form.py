"""The chart editor of the pages: a form's fields as a ``cloud.xmanager.v1.Chart``, and a chart back as the form.

Pure functions (no ORM, no request). ``ui.chart_edit`` turns the posted form into a Chart with
`chart_from_form` and hands it to the DashboardService's own CreateChart / UpdateChart handlers,
which validate it (a refused field comes back named, next to the form); `form_of` fills the form
from a stored chart to edit it. What the form offers: a title, the metrics (of the experiment), the
units (the chart's own or every unit of the experiment: ``mapping.color = work_unit``, which
``ui.plotdata.scope_of`` reads), a grouping by argument (``mapping.group = arg.<name>``, mean per
value), the plot (lines, bars of the last values, a summary table) and the geom of lines.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core import pb

M = pb.dashboard
#: The plot kinds the form offers: value -> (PlotType, words).
KINDS = {"lines": (M.SCATTER, "Lines by step"), "bars": (M.BAR, "Bars of the last value"),
         "summary": (M.SUMMARY_BOX, "Summary table")}
#: The geoms of lines: value -> (GeomType, words).
GEOMS = {"line": (M.GeomSpec.LINE, "line"), "points": (M.GeomSpec.POINT, "points"),
         "area": (M.GeomSpec.AREA, "area"), "bars": (M.GeomSpec.BAR, "bars")}
UNITS = {"this": "This work unit", "all": "Every work unit of the experiment"}


@dataclass
class ChartForm:
    """What the form shows and sends (the query-dict names are the attribute names)."""

    title: str = ""
    metrics: list[str] = field(default_factory=list)
    units: str = "this"  # "this" | "all"
    group: str = ""  # an argument name, or "" for none
    kind: str = "lines"
    geom: str = "line"
    dashboard: str = ""  # a dashboard id to add the chart to, "new" for a new one, "" for none
    dashboard_title: str = ""


def read_form(data: Any) -> ChartForm:
    """The posted fields (a QueryDict), trimmed; unknown choices fall back to the defaults."""
    return ChartForm(
        title=str(data.get("title", "")).strip()[:500], metrics=[m[:256] for m in data.getlist("metrics")[:100]],
        units=data.get("units") if data.get("units") in UNITS else "this", group=str(data.get("group", ""))[:256],
        kind=data.get("kind") if data.get("kind") in KINDS else "lines",
        geom=data.get("geom") if data.get("geom") in GEOMS else "line",
        dashboard=str(data.get("dashboard", ""))[:63], dashboard_title=str(data.get("dashboard_title", "")).strip()[:500])


def chart_from_form(form: ChartForm) -> Any:
    """The ``Chart`` the form describes: one plot of its metrics (validated by the handler, not here)."""
    kind, _ = KINDS[form.kind]
    plot = M.PlotSpec(plot_id="main", title=form.title, type=kind, data=M.DataSpec(metrics=form.metrics),
                      mapping=M.MappingSpec(x="step" if form.kind == "lines" else ""))
    if form.group:
        plot.mapping.group = f"arg.{form.group}"
    elif form.units == "all":
        plot.mapping.color = "work_unit"
    if form.kind == "lines":
        plot.geoms.add(type=GEOMS[form.geom][0])
    return M.Chart(title=form.title, plots=[plot], plot_layout=M.LayoutSpec(type=M.LayoutSpec.GRID, columns=1))


def form_of(chart: Any) -> ChartForm:
    """A stored chart as the form shows it (its first plot; a chart made elsewhere may say more)."""
    if not chart.plots:
        return ChartForm(title=chart.title)
    plot = chart.plots[0]
    kind = next((k for k, (t, _) in KINDS.items() if t == plot.type), "lines")
    geoms = {g.type for g in plot.geoms}
    group = plot.mapping.group.split(".", 1)[1] if plot.mapping.group.startswith(("arg.", "args.")) else ""
    return ChartForm(title=chart.title, metrics=list(plot.data.metrics), kind=kind, group=group,
                     units="all" if plot.mapping.color in ("work_unit", "wid") or group else "this",
                     geom=next((g for g, (t, _) in GEOMS.items() if t in geoms), "line"))


def choices(form: ChartForm, metrics: Sequence[str], args: Sequence[str],
            dashboards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The template's options, each with whether the form has it."""
    return {
        "metric_options": [(m, m in form.metrics) for m in dict.fromkeys([*metrics, *form.metrics])],
        "group_options": [(a, a == form.group) for a in dict.fromkeys([*args, *([form.group] if form.group else [])])],
        "kinds": [(k, words, k == form.kind) for k, (_, words) in KINDS.items()],
        "geoms": [(g, words, g == form.geom) for g, (_, words) in GEOMS.items()],
        "units_options": [(u, words, u == form.units) for u, words in UNITS.items()],
        "dashboard_options": [(d["dashboard_id"], d["title"], d["dashboard_id"] == form.dashboard) for d in dashboards],
    }
