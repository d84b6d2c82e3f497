"""Validation of chart, plot and layout specs: pure functions over ``cloud.xmanager.v1`` messages.

Called by `metrics.services` before anything is written (and so for every
transport). Each check raises ``core.errors.InvalidArgument`` naming the
field at fault with its path in the request (``chart.plots[1].data.metrics``).
Proto3 enums are open, so an unknown number arrives intact: it is refused
here, as are absurd sizes, NaN and infinite bounds, and ranges whose end
precedes their start.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import EnumDescriptor

from core import limits, pb
from core.errors import InvalidArgument

M = pb.dashboard

#: Client-chosen chart, dashboard and plot ids (AIP-122, plus the "_" xdash uses); UUIDs match too.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
#: A metric name: printable, no control characters.
METRIC_PATTERN = re.compile(r"[^\x00-\x1f\x7f]{1,256}")
MAX_PLOTS = 50
MAX_METRICS = 100
MAX_RANGES = 20
MAX_GEOMS = 20
MAX_CHARTS_PER_DASHBOARD = 200
MAX_POSITIONS = 1000
MAX_GRID = 10_000
MAX_SMOOTH_WINDOW = 10_000
MAX_FORECAST_STEPS = 10_000
MAX_FACETS = 8
#: ``mapping.x``: what the x axis is.
X_MAPPINGS = frozenset({"", "step", "time"})
#: ``mapping.color`` / ``mapping.group``: one series per work unit, or per value of an arg.
GROUP_MAPPINGS = frozenset({"", "work_unit", "wid"})
ARG_MAPPING = re.compile(r"(?:arg|args)[.:]([A-Za-z0-9_.-]{1,256})")


def check_id(value: str, field: str) -> None:
    if not ID_PATTERN.fullmatch(value or ""):
        raise InvalidArgument(
            f"{field} must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit "
            f"(got {value[:80]!r})", field=field)


def _enum(descriptor: EnumDescriptor, number: int, field: str, *, required: bool = False) -> None:
    if number not in descriptor.values_by_number:
        raise InvalidArgument(f"{field}: {number} is not a {descriptor.name} value", field=field)
    if required and number == 0:
        raise InvalidArgument(f"{field} is required (one of "
                              f"{', '.join(v.name for v in descriptor.values if v.number)})", field=field)


def _finite(value: float, field: str) -> None:
    if not math.isfinite(value):
        raise InvalidArgument(f"{field} must be a finite number", field=field)


def _count(items: Sequence[Any], limit: int, field: str) -> None:
    if len(items) > limit:
        raise InvalidArgument(f"{field} has {len(items)} entries; at most {limit} are allowed", field=field)


def _between(value: int, low: int, high: int, field: str) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{field} must be between {low} and {high} (got {value})", field=field)


def check_layout(layout: Any, field: str) -> None:
    """A ``LayoutSpec``: a known type, a sane grid."""
    _enum(M.LayoutSpec.LayoutType.DESCRIPTOR, layout.type, f"{field}.type")
    _between(layout.columns, 0, 64, f"{field}.columns")
    _count(layout.positions, MAX_POSITIONS, f"{field}.positions")
    for i, position in enumerate(layout.positions):
        where = f"{field}.positions[{i}]"
        limits.check_text(position.item_id, f"{where}.item_id", 256)
        for name in ("x", "y", "width", "height"):
            _between(getattr(position, name), 0, MAX_GRID, f"{where}.{name}")


def check_plot(plot: Any, field: str) -> None:
    """One ``PlotSpec``."""
    check_id(plot.plot_id, f"{field}.plot_id")
    limits.check_text(plot.title, f"{field}.title", limits.TITLE)
    _enum(M.PlotType.DESCRIPTOR, plot.type, f"{field}.type", required=True)
    data = plot.data
    if not data.metrics:
        raise InvalidArgument(f"{field}.data.metrics must name at least one metric", field=f"{field}.data.metrics")
    _count(data.metrics, MAX_METRICS, f"{field}.data.metrics")
    for i, metric in enumerate(data.metrics):
        if not METRIC_PATTERN.fullmatch(metric) or not metric.strip():
            raise InvalidArgument(f"{field}.data.metrics[{i}] must be 1 to 256 printable characters",
                                  field=f"{field}.data.metrics[{i}]")
    _count(data.ranges, MAX_RANGES, f"{field}.data.ranges")
    for i, data_range in enumerate(data.ranges):
        _check_range(data_range, f"{field}.data.ranges[{i}]")
    mapping = plot.mapping
    if mapping.x not in X_MAPPINGS:
        raise InvalidArgument(f"{field}.mapping.x must be 'step' or 'time' (got {mapping.x[:80]!r})",
                              field=f"{field}.mapping.x")
    if mapping.y and mapping.y not in ("value", *data.metrics):
        raise InvalidArgument(f"{field}.mapping.y must be 'value' or one of data.metrics (got {mapping.y[:80]!r})",
                              field=f"{field}.mapping.y")
    for name in ("color", "group"):
        value = getattr(mapping, name)
        if value not in GROUP_MAPPINGS and not ARG_MAPPING.fullmatch(value):
            raise InvalidArgument(f"{field}.mapping.{name} must be 'work_unit' or 'arg.<name>' (got {value[:80]!r})",
                                  field=f"{field}.mapping.{name}")
    limits.check_text(mapping.size, f"{field}.mapping.size", 256)
    _count(plot.geoms, MAX_GEOMS, f"{field}.geoms")
    for i, geom in enumerate(plot.geoms):
        where = f"{field}.geoms[{i}]"
        _enum(M.GeomSpec.GeomType.DESCRIPTOR, geom.type, f"{where}.type")
        for name in ("yintercept", "xintercept"):
            _finite(getattr(geom, name), f"{where}.{name}")
        style = geom.style
        _finite(style.opacity, f"{where}.style.opacity")
        _finite(style.size, f"{where}.style.size")
        if not 0 <= style.opacity <= 1:
            raise InvalidArgument(f"{where}.style.opacity must be between 0 and 1", field=f"{where}.style.opacity")
        limits.check_text(style.color, f"{where}.style.color", 64)
        limits.check_text(style.line_style, f"{where}.style.line_style", 64)
    _check_stats(plot.stats, f"{field}.stats")
    coords = plot.coords
    _enum(M.CoordSpec.ScaleType.DESCRIPTOR, coords.x_scale, f"{field}.coords.x_scale")
    _enum(M.CoordSpec.ScaleType.DESCRIPTOR, coords.y_scale, f"{field}.coords.y_scale")
    _finite(coords.y_min, f"{field}.coords.y_min")
    _finite(coords.y_max, f"{field}.coords.y_max")
    if coords.y_min > coords.y_max and coords.y_max != 0:
        raise InvalidArgument(f"{field}.coords.y_max must not be below y_min", field=f"{field}.coords.y_max")
    if plot.HasField("facets"):
        facets = plot.facets
        _enum(M.FacetSpec.FacetType.DESCRIPTOR, facets.type, f"{field}.facets.type", required=True)
        if not facets.facet_by:
            raise InvalidArgument(f"{field}.facets.facet_by must name at least one field",
                                  field=f"{field}.facets.facet_by")
        _count(facets.facet_by, MAX_FACETS, f"{field}.facets.facet_by")
        for i, name in enumerate(facets.facet_by):
            limits.check_text(name, f"{field}.facets.facet_by[{i}]", 256)
        _between(facets.ncol, 0, 64, f"{field}.facets.ncol")
        _between(facets.nrow, 0, 64, f"{field}.facets.nrow")


def _check_range(data_range: Any, field: str) -> None:
    start, end = data_range.WhichOneof("start"), data_range.WhichOneof("end")
    if start is None and end is None:
        raise InvalidArgument(f"{field} needs a start or an end", field=field)
    if start and end and start.split("_")[1] != end.split("_")[1]:
        raise InvalidArgument(f"{field}: start and end must both be steps or both be times", field=field)
    for name in ("start_time", "end_time"):
        if data_range.HasField(name):
            ts = getattr(data_range, name)
            if not (-62135596800 <= ts.seconds <= 253402300799) or not 0 <= ts.nanos < 10**9:
                raise InvalidArgument(f"{field}.{name} is not a valid timestamp", field=f"{field}.{name}")
    if start == "start_step" and end == "end_step" and data_range.end_step < data_range.start_step:
        raise InvalidArgument(f"{field}.end_step precedes start_step", field=f"{field}.end_step")
    if start == "start_time" and end == "end_time" and (
            (data_range.end_time.seconds, data_range.end_time.nanos)
            < (data_range.start_time.seconds, data_range.start_time.nanos)):
        raise InvalidArgument(f"{field}.end_time precedes start_time", field=f"{field}.end_time")


def _check_stats(stats: Any, field: str) -> None:
    S = M.StatSpec
    _enum(S.StatType.DESCRIPTOR, stats.type, f"{field}.type")
    _enum(S.Aggregation.DESCRIPTOR, stats.aggregation, f"{field}.aggregation")
    smooth = stats.smooth
    _enum(S.SmoothConfig.Algorithm.DESCRIPTOR, smooth.algorithm, f"{field}.smooth.algorithm")
    _finite(smooth.alpha, f"{field}.smooth.alpha")
    if not 0 <= smooth.alpha <= 1:
        raise InvalidArgument(f"{field}.smooth.alpha must be between 0 and 1", field=f"{field}.smooth.alpha")
    _between(smooth.window_size, 0, MAX_SMOOTH_WINDOW, f"{field}.smooth.window_size")
    forecast = stats.forecast
    for name in ("alpha", "beta"):
        value = getattr(forecast, name)
        _finite(value, f"{field}.forecast.{name}")
        if not 0 <= value <= 1:
            raise InvalidArgument(f"{field}.forecast.{name} must be between 0 and 1",
                                  field=f"{field}.forecast.{name}")
    _between(forecast.steps_ahead, 0, MAX_FORECAST_STEPS, f"{field}.forecast.steps_ahead")
    if stats.type == S.FORECAST and forecast.steps_ahead < 1:
        raise InvalidArgument(f"{field}.forecast.steps_ahead must be at least 1 for FORECAST",
                              field=f"{field}.forecast.steps_ahead")


def check_chart(chart: Any, field: str = "chart") -> None:
    """A ``Chart``'s own fields (not its name or xid/wid, which the caller resolves)."""
    if not chart.title.strip():
        raise InvalidArgument(f"{field}.title is required", field=f"{field}.title")
    limits.check_text(chart.title, f"{field}.title", limits.TITLE)
    limits.check_text(chart.description, f"{field}.description", limits.NOTES)
    check_plots(chart.plots, f"{field}.plots")
    check_layout(chart.plot_layout, f"{field}.plot_layout")


def check_plots(plots: Sequence[Any], field: str) -> None:
    if not plots:
        raise InvalidArgument(f"{field} must hold at least one plot", field=field)
    _count(plots, MAX_PLOTS, field)
    seen: set[str] = set()
    for i, plot in enumerate(plots):
        check_plot(plot, f"{field}[{i}]")
        if plot.plot_id in seen:
            raise InvalidArgument(f"{field}[{i}].plot_id {plot.plot_id!r} is used twice", field=f"{field}[{i}].plot_id")
        seen.add(plot.plot_id)


def check_dashboard(dashboard: Any, field: str = "dashboard") -> None:
    """A ``Dashboard``'s own fields (chart ids are resolved by the service)."""
    if not dashboard.title.strip():
        raise InvalidArgument(f"{field}.title is required", field=f"{field}.title")
    limits.check_text(dashboard.title, f"{field}.title", limits.TITLE)
    limits.check_text(dashboard.description, f"{field}.description", limits.NOTES)
    check_layout(dashboard.chart_layout, f"{field}.chart_layout")
    check_chart_ids(dashboard.chart_ids, f"{field}.chart_ids")


def check_chart_ids(chart_ids: Sequence[str], field: str) -> None:
    _count(chart_ids, MAX_CHARTS_PER_DASHBOARD, field)
    seen: set[str] = set()
    for i, chart_id in enumerate(chart_ids):
        check_id(chart_id, f"{field}[{i}]")
        if chart_id in seen:
            raise InvalidArgument(f"{field}[{i}]: chart {chart_id!r} is referenced twice", field=f"{field}[{i}]")
        seen.add(chart_id)
