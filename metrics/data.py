"""GetChartData: read a chart's points in SQL, bounded by its width, and evaluate each plot.

Called by ``xmc.api.dashboards`` after the access check. For each plot the
points of the plot's metrics, of the current execution of each work unit in
scope (a restart starts new series; older executions' points stay apart), in
the plot's data ranges, are read in two statements: each series' first and
last step from the (execution, metric, step) b-tree (`_STEP_BOUNDS_SQL`, two
index probes per series; `_TIME_BOUNDS_SQL` for x = time), then one that
buckets the points in Postgres (`_SERIES_SQL`): ``width_bucket`` over the x
range of the metric (the same buckets for every work unit, so they can be
aggregated) into at most as many buckets as the chart is pixels wide, one row
per bucket with min, avg and max (one bucket per step when the steps fit). A
chart over millions of points moves at most width x series rows. SUMMARY (latest, min, max, mean, latest step and
time) and HISTOGRAM counts are computed in SQL over every point
(`_SUMMARY_SQL`, `_HISTOGRAM_SQL`). Smoothing, forecasts, aggregation across
work units and clipping run on the bucketed series in `metrics.evaluate`.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import psycopg
import psycopg.adapt
import psycopg.postgres
from django.db import connection

from core import pb
from metrics import evaluate, specs, wire
from metrics.evaluate import Bucket
from metrics.models import BLOCK_SIZES, EAGER_BLOCK_SIZES, MetricPoint, PointBlock, PointSpan
from metrics.services import roll_up_blocks
from workunits.models import WorkUnit, WorkUnitExecution

M = pb.dashboard
DEFAULT_WIDTH = 1000
MAX_WIDTH = 10_000
HISTOGRAM_BINS = 20

_POINTS = MetricPoint._meta.db_table
_BLOCKS = PointBlock._meta.db_table
_EXECUTIONS = WorkUnitExecution._meta.db_table
_WORK_UNITS = WorkUnit._meta.db_table


@dataclass(frozen=True)
class Scope:
    """Whose points: one experiment, one work unit of it or all of them (``wid`` None), or, with ``wids``,
    those work units of it (the pages' compare view)."""

    xid: int
    wid: int | None
    wids: tuple[int, ...] = ()


def _ranges(data: Any) -> tuple[str, list[Any]]:
    """The plot's data ranges as one SQL condition on ``p`` (a union of ranges), and its parameters."""
    params: list[Any] = []
    ranges = []
    for data_range in data.ranges:
        parts = []
        if data_range.HasField("start_step"):
            parts.append("p.step >= %s")
            params.append(data_range.start_step)
        if data_range.HasField("start_time"):
            parts.append("p.time >= %s")
            params.append(data_range.start_time.ToDatetime(tzinfo=timezone.utc))
        if data_range.HasField("end_step"):
            parts.append("p.step <= %s")
            params.append(data_range.end_step)
        if data_range.HasField("end_time"):
            parts.append("p.time <= %s")
            params.append(data_range.end_time.ToDatetime(tzinfo=timezone.utc))
        ranges.append("(" + " AND ".join(parts) + ")")
    return ("(" + " OR ".join(ranges) + ")" if ranges else "TRUE"), params


#: The work units in scope (``w``) and their current executions (``e``): a restart starts new series.
_SCOPE_FROM = f"{_WORK_UNITS} w JOIN {_EXECUTIONS} e ON e.work_unit_id = w.id AND e.eid = w.current_eid"


def _scope(scope: Scope) -> tuple[str, list[Any]]:
    """The WHERE condition on ``w`` selecting the scope, and its parameters."""
    if scope.wids:
        return "w.experiment_id = %s AND w.wid = ANY(%s)", [scope.xid, list(scope.wids)]
    if scope.wid is None:
        return "w.experiment_id = %s", [scope.xid]
    return "w.experiment_id = %s AND w.wid = %s", [scope.xid, scope.wid]


_WINDOW_SQL = f"""
SELECT min(s.first_time), max(s.last_time) FROM {{scope_from}} JOIN {PointSpan._meta.db_table} s ON s.execution_id = e.id
WHERE {{scope_where}}
"""


def _window(scope: Scope) -> tuple[datetime, datetime] | None:
    """The earliest and latest time of the points in scope (from their `PointSpan`), None without points."""
    where, params = _scope(scope)
    with connection.cursor() as cursor:
        cursor.execute(_WINDOW_SQL.format(scope_from=_SCOPE_FROM, scope_where=where), params)
        first, last = cursor.fetchone()
    return None if first is None else (first, last)


def _in_window(window: tuple[datetime, datetime]) -> tuple[str, list[Any]]:
    """``p.time`` within ``window``, as literals: the planner reads only the partitions that overlap it."""
    return "p.time BETWEEN %s AND %s", [window[0], window[1]]


def _points_cte(scope: Scope, data: Any, window: tuple[datetime, datetime]) -> tuple[str, list[Any]]:
    where, params = _scope(scope)
    ranges, range_params = _ranges(data)
    in_window, window_params = _in_window(window)
    sql = (f"pts AS (SELECT w.wid, p.metric, p.step, p.value, p.time FROM {_SCOPE_FROM} "
           f"JOIN {_POINTS} p ON p.execution_id = e.id WHERE {where} AND p.metric = ANY(%s) AND {ranges} "
           f"AND {in_window})")
    return sql, [*params, list(data.metrics), *range_params, *window_params]


#: Each series' first and last step, from the (execution, metric, step) b-tree: two index probes per series.
_STEP_BOUNDS_SQL = """
SELECT w.wid, m.metric, lo.step::float8, hi.step::float8
FROM {scope_from} CROSS JOIN unnest(%s::text[]) AS m(metric)
CROSS JOIN LATERAL (SELECT p.step FROM {points} p WHERE p.execution_id = e.id AND p.metric = m.metric AND {ranges}
                    ORDER BY p.step LIMIT 1) lo
CROSS JOIN LATERAL (SELECT p.step FROM {points} p WHERE p.execution_id = e.id AND p.metric = m.metric AND {ranges}
                    ORDER BY p.step DESC LIMIT 1) hi
WHERE {scope_where}
"""

#: The same bounds in time (no index orders a series by time: one pass over it).
_TIME_BOUNDS_SQL = """
SELECT w.wid, p.metric, extract(epoch FROM min(p.time))::float8, extract(epoch FROM max(p.time))::float8
FROM {scope_from} JOIN {points} p ON p.execution_id = e.id
WHERE {scope_where} AND p.metric = ANY(%s) AND {ranges}
GROUP BY 1, 2
"""

#: One row per (work unit, metric, bucket): ``width_bucket`` over the metric's x range, the
#: same buckets for every work unit. With no more steps than pixels, one bucket per step.
_SERIES_SQL = """
SELECT w.wid, p.metric, width_bucket({x}, b.lo, b.hi, b.n) AS bucket,
       max(p.step), extract(epoch FROM max(p.time))::float8, avg(p.value), min(p.value), max(p.value)
FROM {scope_from} JOIN {points} p ON p.execution_id = e.id
JOIN unnest(%s::text[], %s::float8[], %s::float8[], %s::int[]) AS b(metric, lo, hi, n) ON b.metric = p.metric
WHERE {scope_where} AND {ranges}
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""


_SUMMARY_SQL = """
WITH {points}
SELECT DISTINCT ON (wid, metric) wid, metric, value, step, time,
       min(value) OVER w, max(value) OVER w, avg(value) OVER w
FROM pts WINDOW w AS (PARTITION BY wid, metric)
ORDER BY wid, metric, step DESC
"""

_HISTOGRAM_SQL = """
WITH {points},
b AS (SELECT metric, min(value) AS lo, max(value) AS hi FROM pts GROUP BY metric)
SELECT pts.metric, b.lo, b.hi,
       CASE WHEN b.hi = b.lo THEN 1 ELSE LEAST(width_bucket(pts.value, b.lo, b.hi, %s), %s) END AS bin, count(*)
FROM pts JOIN b USING (metric) GROUP BY 1, 2, 3, 4 ORDER BY 1, 4
"""


def _query(template: str, scope: Scope, data: Any, extra: Sequence[Any]) -> list[tuple[Any, ...]]:
    window = _window(scope)
    if window is None:
        return []
    points, params = _points_cte(scope, data, window)
    with connection.cursor() as cursor:
        cursor.execute(template.format(points=points), [*params, *extra])
        return list(cursor.fetchall())


#: One row per (work unit, metric) from the `PointBlock` rows of the size chosen for the metric: each
#: block is a bucket (the same blocks for every work unit). One index range scan of (execution, metric,
#: size, block) per series, in block order; the columns come as arrays (a row per series, not per point).
_BLOCKS_SQL = """
SELECT w.wid, b.metric, k.*
FROM {scope_from} CROSS JOIN unnest(%s::text[], %s::bigint[]) AS b(metric, size)
CROSS JOIN LATERAL (
    SELECT array_agg(k.last_step), array_agg(extract(epoch FROM k.last_time)::float8),
           array_agg(k.sum / k.count::float8), array_agg(k.min), array_agg(k.max)
    FROM (SELECT * FROM {blocks} k WHERE k.execution_id = e.id AND k.metric = b.metric AND k.size = b.size
          ORDER BY k.block) k  -- the index's order, which the aggregates keep (no sort)
    HAVING count(*) > 0) k
WHERE {scope_where}
"""


#: A plot aggregated across work units over blocks: the same blocks, aggregated in SQL per block (the
#: bucket of every work unit), so 100 work units move one series, not 100. {value}, {low}, {high}: the
#: aggregate of the blocks' averages ``a`` (`_SQL_AGGREGATES`).
_BLOCKS_AGGREGATE_SQL = """
SELECT b.metric, max(k.last_step), extract(epoch FROM max(k.last_time))::float8, {value}, {low}, {high}
FROM {scope_from} CROSS JOIN unnest(%s::text[], %s::bigint[]) AS b(metric, size)
CROSS JOIN LATERAL (SELECT k.block, k.last_step, k.last_time, k.sum / k.count::float8 AS a FROM {blocks} k
                    WHERE k.execution_id = e.id AND k.metric = b.metric AND k.size = b.size OFFSET 0) k
WHERE {scope_where}
GROUP BY b.metric, k.block ORDER BY b.metric, k.block
"""

#: (value, low, high) of each aggregation in SQL, as `metrics.evaluate.aggregate` computes them.
_CI95 = "1.96 * coalesce(stddev_samp(k.a), 0) / sqrt(count(*))"
_SQL_AGGREGATES = {
    "MEAN": ("avg(k.a)",) * 3,
    "MEDIAN": ("percentile_cont(0.5) WITHIN GROUP (ORDER BY k.a)",) * 3,
    "MIN": ("min(k.a)",) * 3,
    "MAX": ("max(k.a)",) * 3,
    "SUM": ("sum(k.a)",) * 3,
    "MEAN_CI_95": ("avg(k.a)", f"avg(k.a) - {_CI95}", f"avg(k.a) + {_CI95}"),
}

#: Up to this many points a bucket, a chart reads the points themselves (``width_bucket``, exactly
#: ``width`` buckets); beyond, blocks (between ``width / 4`` and ``width`` of them, see `block_size`).
RAW_POINTS_PER_BUCKET = 4


def block_size(steps: float, width: int) -> int | None:
    """The `PointBlock` size a series of ``steps`` steps is read in at ``width`` buckets, or None to read
    its points: the smallest size at least ``steps / width`` wide, so at most ``width`` blocks (and at
    least half as many; a quarter when the finest size is wider than a pixel)."""
    per_bucket = steps / width
    if per_bucket <= RAW_POINTS_PER_BUCKET:
        return None
    return next((size for size in BLOCK_SIZES if size >= per_bucket), BLOCK_SIZES[-1])


#: Buckets a chart answers per metric across its series, per pixel of width: past this many series, each
#: series read in blocks gets fewer (`series_width`). 100 work units x 10,000 steps at 1,000 px read
#: 313 blocks a series instead of 625: half the rows, half the bytes, for lines no screen tells apart.
SERIES_BUDGET = 32
#: The fewest buckets a series read in blocks is given however many series share the chart.
MIN_SERIES_WIDTH = 100


def series_width(width: int, series: int) -> int:
    """The buckets each of ``series`` series of one metric is read in at ``width`` pixels (`SERIES_BUDGET`)."""
    return max(min(width, MIN_SERIES_WIDTH), min(width, SERIES_BUDGET * width // max(1, series)))


#: A series' bucket as a plain tuple: (step, time_s, avg, min, max), `Bucket`'s fields.
Row = tuple[int, float, float, float, float]


@dataclass(frozen=True)
class Columns:
    """A series as read, in step order: its buckets' fields as numpy arrays (a chart of 100 work units
    at 1,000 px reads 100,000 buckets: as arrays they are never Python objects on the common path, from
    the binary rows Postgres sends to the wire bytes of the answer)."""

    steps: npt.NDArray[np.int64]
    times: npt.NDArray[np.float64]  # unix seconds
    avgs: npt.NDArray[np.float64]
    mins: npt.NDArray[np.float64]
    maxs: npt.NDArray[np.float64]

    FIELDS: ClassVar = ("steps", "times", "avgs", "mins", "maxs")

    @classmethod
    def of(cls, buckets: Sequence[Row]) -> Columns:
        if not buckets:
            empty = np.empty(0, np.float64)
            return cls(np.empty(0, np.int64), empty, empty, empty, empty)
        steps, times, avgs, mins, maxs = zip(*buckets)
        return cls(np.asarray(steps, np.int64), np.asarray(times, np.float64), np.asarray(avgs, np.float64),
                   np.asarray(mins, np.float64), np.asarray(maxs, np.float64))

    def __len__(self) -> int:
        return len(self.steps)

    def buckets(self) -> list[Bucket]:
        return [Bucket(*row) for row in zip(*(getattr(self, f).tolist() for f in self.FIELDS))]


def _columns(series: Columns | Sequence[Row]) -> Columns:
    return series if isinstance(series, Columns) else Columns.of(series)


class _ArrayLoader(psycopg.adapt.Loader):
    """A one-dimensional binary array of non-null ``float8`` or ``int8`` as a numpy array, read straight
    from the bytes Postgres sent (psycopg's own loader makes a Python number of every element)."""

    format = psycopg.pq.Format.BINARY
    element: ClassVar[str]

    def load(self, data: Any) -> npt.NDArray[Any]:
        ndim, has_null = struct.unpack_from("!ii", data)
        if ndim == 0:
            return np.empty(0, self.element)
        if ndim != 1 or has_null:
            raise psycopg.DataError(f"expected a one-dimensional array without nulls, got {ndim} dimensions"
                                    f"{' with nulls' if has_null else ''}")
        (length,) = struct.unpack_from("!i", data, 12)
        # After the 20-byte header, each element is its length (int32) and its value, big-endian.
        items = np.frombuffer(data, np.dtype([("size", ">i4"), ("value", ">" + self.element)]), length, 20)
        return items["value"].astype(self.element)


class _Float8ArrayLoader(_ArrayLoader):
    element = "f8"


class _Int8ArrayLoader(_ArrayLoader):
    element = "i8"


def _numpy_arrays(cursor: psycopg.Cursor[Any]) -> None:
    """Make ``cursor`` read ``float8[]`` and ``int8[]`` columns in binary as numpy arrays."""
    types = psycopg.postgres.types
    for name, loader in (("float8", _Float8ArrayLoader), ("int8", _Int8ArrayLoader)):
        info = types.get(name)
        assert info is not None
        cursor.adapters.register_loader(info.array_oid, loader)


#: Series per (work unit, metric), and series already aggregated across work units per metric.
ReadSeries = tuple[dict[tuple[int, str], Columns], dict[str, list[Bucket]]]


def _series(scope: Scope, plot: Any, width: int, aggregate: str = "") -> ReadSeries:
    """The plot's series, bucketed; with ``aggregate`` (a `_SQL_AGGREGATES` name), the metrics read in
    blocks come aggregated across work units."""
    x_time = plot.mapping.x == "time"
    window = _window(scope)
    if window is None:
        return {}, {}
    scope_where, scope_params = _scope(scope)
    ranges, range_params = _ranges(plot.data)
    in_window, window_params = _in_window(window)
    ranges, range_params = f"{ranges} AND {in_window}", [*range_params, *window_params]
    parts = {"scope_from": _SCOPE_FROM, "scope_where": scope_where, "points": _POINTS, "ranges": ranges,
             "blocks": _BLOCKS}
    metrics = list(plot.data.metrics)
    with connection.cursor() as cursor:
        if x_time:
            cursor.execute(_TIME_BOUNDS_SQL.format(**parts), [*scope_params, metrics, *range_params])
        else:
            cursor.execute(_STEP_BOUNDS_SQL.format(**parts), [metrics, *range_params, *range_params, *scope_params])
        bounds: dict[str, tuple[float, float]] = {}
        series_of: dict[str, int] = {}
        for _wid, metric, low, high in cursor.fetchall():
            lo, hi = bounds.get(metric, (low, high))
            bounds[metric] = (min(lo, low), max(hi, high))
            series_of[metric] = series_of.get(metric, 0) + 1
        if not bounds:
            return {}, {}
        names, lows, highs, counts = [], [], [], []
        blocked_names: list[str] = []
        blocked_sizes: list[int] = []
        for metric, (low, high) in bounds.items():
            if x_time:
                names.append(metric)
                lows.append(low)
                highs.append(high + 1e-3)
                counts.append(width)
                continue
            # Integer steps: [lo, hi + 1) in at most `width` buckets, one per step when they fit. Without
            # data ranges (a block may straddle a range's end), many steps a bucket read blocks, not points.
            n = int(min(width, high - low + 1))
            # Series aggregated across units are one series answered: the budget is for those drawn apiece.
            size = None if plot.data.ranges else block_size(
                high - low + 1, series_width(width, 1 if aggregate else series_of[metric]))
            if size is None:
                names.append(metric)
                lows.append(low)
                highs.append(high + 1)
                counts.append(n)
            else:
                blocked_names.append(metric)
                blocked_sizes.append(size)
        rows = []
        if names:
            x = "extract(epoch FROM p.time)::float8" if x_time else "p.step::float8"
            cursor.execute(_SERIES_SQL.format(x=x, **parts),
                           [names, lows, highs, counts, *scope_params, *range_params])
            rows.extend(cursor.fetchall())
        blocked = []
        aggregated: dict[str, list[Bucket]] = {}
        lazy = sorted({m for m, size in zip(blocked_names, blocked_sizes) if size not in EAGER_BLOCK_SIZES})
        if lazy:
            # Those sizes lag the write path (`metrics.models.LAZY_BLOCK_SIZES`): bring them up to date
            # for this scope's series first (its pending rows only: a few cycles' worth at most).
            roll_up_blocks(cursor, f"p.metric = ANY(%s) AND p.execution_id IN (SELECT e.id FROM {_SCOPE_FROM} "
                           f"WHERE {scope_where})", [lazy, *scope_params])
        if blocked_names and aggregate:
            value, low, high = _SQL_AGGREGATES[aggregate]
            cursor.execute(_BLOCKS_AGGREGATE_SQL.format(value=value, low=low, high=high, **parts),
                           [blocked_names, blocked_sizes, *scope_params])
            for metric, step, time_s, avg, lo, hi in cursor.fetchall():
                aggregated.setdefault(metric, []).append(Bucket(step, time_s, avg, lo, hi))
            blocked_names = []
        if blocked_names:
            # Arrays of numbers: fetched in binary as numpy arrays (`_numpy_arrays`), through a
            # server-side-binding cursor on the same connection (Django's binds client-side, text only).
            with psycopg.Cursor(cursor.cursor.connection) as binary:
                _numpy_arrays(binary)
                binary.execute(_BLOCKS_SQL.format(**parts), [blocked_names, blocked_sizes, *scope_params],
                               binary=True)
                blocked = binary.fetchall()
    raw: dict[tuple[int, str], list[Row]] = {}
    for row in rows:  # (wid, metric, bucket, step, time_s, avg, min, max): bigint and float8 columns
        raw.setdefault((row[0], row[1]), []).append(row[3:])
    out = {key: Columns.of(buckets) for key, buckets in raw.items()}
    for wid, metric, *columns in blocked:  # (wid, metric, steps[], times[], avgs[], mins[], maxs[])
        out[(wid, metric)] = Columns(*columns)
    return out, aggregated


def _add_scatter(message: Any, plot: Any, xid: int, series: Sequence[Series]) -> None:
    """Add one scatter ``PlotData`` per series to ``message`` (a `ChartData`), the points of all of them
    encoded to wire bytes at once (`metrics.wire.series_points_wire`) and parsed into each series."""
    entries = []
    for label, metric, buckets in series:
        entry = message.plots_data.add(plot_id=plot.plot_id, type=plot.type or M.SCATTER)
        data = entry.scatter_series
        data.metric_name, data.work_unit_id, data.xid = metric, label, xid
        entries.append((data, _columns(buckets)))
    if not entries:
        return
    blob = memoryview(wire.series_points_wire(
        *(np.concatenate([getattr(columns, f) for _, columns in entries]) for f in Columns.FIELDS)))
    at = 0
    for data, columns in entries:
        end = at + len(columns) * wire.POINT_WIRE_LENGTH
        data.MergeFromString(blob[at:end])
        at = end


def _arg_values(scope: Scope, name: str) -> dict[int, str]:
    """wid -> the value of arg ``name`` of each work unit in scope (its first job's ``args``; "" without)."""
    units = WorkUnit.objects.filter(experiment_id=scope.xid)
    if scope.wid is not None:
        units = units.filter(wid=scope.wid)
    elif scope.wids:
        units = units.filter(wid__in=list(scope.wids))
    out = {}
    for wid, executable in units.values_list("wid", "executable"):
        jobs = ((executable or {}).get("jobset") or {}).get("jobs") or [{}]
        out[int(wid)] = str(((jobs[0].get("spec") or {}).get("args") or {}).get(name, ""))
    return out


#: One evaluated series: its label (the work unit id, ``name=value`` of a group by arg, or "" for
#: an aggregate over all), its metric and its points (as read, or evaluated into `Bucket`s).
Series = tuple[str, str, Columns | Sequence[Bucket]]


def _aggregation(plot: Any) -> tuple[str, Any]:
    """The plot's aggregation across work units ("" for none) and its group-by-arg match (or None)."""
    S = M.StatSpec
    how = S.Aggregation.Name(plot.stats.aggregation) if plot.stats.aggregation != S.AGG_UNSPECIFIED else ""
    return how, specs.ARG_MAPPING.fullmatch(plot.mapping.group)


def _stat_series(scope: Scope, plot: Any, read: ReadSeries) -> list[Series]:
    rows, aggregated = read
    stats = plot.stats
    S = M.StatSpec
    how, arg = _aggregation(plot)
    coords = plot.coords
    if arg is None and not how and stats.type not in (S.SMOOTH, S.FORECAST) and not (coords.y_min or coords.y_max):
        return [(str(wid), metric, b) for (wid, metric), b in sorted(rows.items())]  # the series as read
    series = {key: columns.buckets() for key, columns in rows.items()}
    out: list[tuple[str, str, list[Bucket]]] = [(str(wid), metric, b) for (wid, metric), b in sorted(series.items())]
    if arg is not None:
        # One series per value of the arg: the work units sharing it, aggregated (MEAN by default).
        values = _arg_values(scope, arg.group(1))
        groups: dict[tuple[str, str], list[list[Bucket]]] = {}
        for (wid, metric), buckets in sorted(series.items()):
            groups.setdefault((f"{arg.group(1)}={values.get(wid, '')}", metric), []).append(buckets)
        out = [(label, metric, evaluate.aggregate(members, how or "MEAN"))
               for (label, metric), members in sorted(groups.items())]
    elif how:
        out = [("", metric, evaluate.aggregate([b for (_, m), b in sorted(series.items()) if m == metric], how))
               for metric in dict.fromkeys(m for _, m in sorted(series))]
        out = sorted([*out, *(("", metric, buckets) for metric, buckets in aggregated.items())],
                     key=lambda one: one[1])
    if stats.type == S.SMOOTH:
        if stats.smooth.algorithm == S.SmoothConfig.MOVING_AVERAGE:
            window = stats.smooth.window_size or evaluate.DEFAULT_WINDOW
            out = [(w, m, evaluate.smooth(b, lambda v: evaluate.moving_average(v, window))) for w, m, b in out]
        else:
            alpha = stats.smooth.alpha or evaluate.DEFAULT_SMOOTH_ALPHA
            out = [(w, m, evaluate.smooth(b, lambda v: evaluate.exponential(v, alpha))) for w, m, b in out]
    elif stats.type == S.FORECAST:
        alpha = stats.forecast.alpha or evaluate.DEFAULT_FORECAST_ALPHA
        beta = stats.forecast.beta or evaluate.DEFAULT_FORECAST_BETA
        out = [(w, m, [*b, *evaluate.forecast(b, alpha, beta, stats.forecast.steps_ahead)]) for w, m, b in out]
    if coords.y_min or coords.y_max:
        high = coords.y_max if coords.y_max else float("inf")
        out = [(w, m, evaluate.clip(b, coords.y_min, high)) for w, m, b in out]
    return [(w, m, b) for w, m, b in out]


def plot_data(scope: Scope, plot: Any, width: int) -> list[Any]:
    """The ``PlotData`` entries of one plot: one per series (metric x work unit, or per metric aggregated)."""
    message = M.ChartData()
    _add_plot_data(message, scope, plot, width)
    return list(message.plots_data)


def _add_plot_data(message: Any, scope: Scope, plot: Any, width: int) -> None:
    """Add the plot's ``PlotData`` entries to ``message`` (a `ChartData`), in place: copying a large
    entry into the answer would cost as much as making it."""
    if plot.type == M.SUMMARY_BOX or plot.stats.type == M.StatSpec.SUMMARY:
        message.plots_data.extend(_summary_data(scope, plot))
        return
    if plot.type == M.HISTOGRAM:
        message.plots_data.extend(_histogram_data(scope, plot))
        return
    how, arg = _aggregation(plot)
    series = _stat_series(scope, plot, _series(scope, plot, width, how if arg is None else ""))
    if plot.type == M.BAR:
        message.plots_data.extend(_bar_data(plot, series))
    else:
        _add_scatter(message, plot, scope.xid, series)


def summary_label(metric: str, wid: int) -> str:
    """A summary's ``metric_name`` over an experiment: ``SummaryBoxValue`` has no work unit field, so the
    label names it, as a BAR's category does (``wid 3``)."""
    return f"{metric} · wid {wid}"


def _summary_data(scope: Scope, plot: Any) -> list[Any]:
    rows = _query(_SUMMARY_SQL, scope, plot.data, ())
    out = []
    for wid, metric, value, step, time, low, high, mean in rows:
        name = metric if scope.wid is not None else summary_label(metric, wid)
        summary = M.ChartData.SummaryBoxValue(metric_name=name, latest_value=value, min_value=low,
                                              max_value=high, mean_value=float(mean), latest_step=step)
        summary.latest_timestamp.FromDatetime(time)
        out.append(M.ChartData.PlotData(plot_id=plot.plot_id, type=plot.type, summary_data=summary))
    return out


def _histogram_data(scope: Scope, plot: Any) -> list[Any]:
    rows = _query(_HISTOGRAM_SQL, scope, plot.data, (HISTOGRAM_BINS, HISTOGRAM_BINS))
    bins: dict[str, tuple[list[str], list[int]]] = {}
    for metric, low, high, bin_number, count in rows:
        if metric not in bins:
            labels = evaluate.bin_labels(float(low), float(high), HISTOGRAM_BINS)
            bins[metric] = (labels, [0] * len(labels))
        bins[metric][1][int(bin_number) - 1] += int(count)
    out = []
    for metric, (labels, counts) in bins.items():
        message = M.ChartData.BarData(metric_name=metric)
        for label, count in zip(labels, counts):
            message.buckets.add(category_or_bin=label, value_or_count=count)
        out.append(M.ChartData.PlotData(plot_id=plot.plot_id, type=plot.type, bar_data=message))
    return out


def _bar_data(plot: Any, series: Sequence[Series]) -> list[Any]:
    """One bar per work unit (or per aggregate): the latest value of each metric."""
    by_metric: dict[str, Any] = {}
    for label, metric, buckets in series:
        if not len(buckets):
            continue
        bar = by_metric.setdefault(metric, M.ChartData.BarData(metric_name=metric))
        category = f"wid {label}" if (label.isascii() and label.isdigit()) else label or "all"
        bar.buckets.add(category_or_bin=category, value_or_count=float(_columns(buckets).avgs[-1]))
    return [M.ChartData.PlotData(plot_id=plot.plot_id, type=plot.type, bar_data=b) for b in by_metric.values()]


def chart_data(name: str, scope: Scope, plots: Sequence[Any], width: int) -> Any:
    message = M.ChartData(name=name, xid=scope.xid, wid=scope.wid or 0)
    for plot in plots:
        _add_plot_data(message, scope, plot, width)
    return message


#: The distinct metrics of one execution, walking the `PointBlock` primary key (execution, metric, size,
#: block) from one metric to the next: a loose index scan, one probe per metric however many points it
#: has, on the one unpartitioned table every write fills (the points' own key is split by day).
_METRIC_NAMES_SQL = f"""
WITH RECURSIVE e AS (SELECT e.id FROM {_SCOPE_FROM} WHERE w.experiment_id = %s AND w.wid = %s),
names(metric) AS (
  (SELECT b.metric FROM {_BLOCKS} b, e WHERE b.execution_id = e.id ORDER BY b.metric LIMIT 1)
  UNION ALL
  SELECT (SELECT b.metric FROM {_BLOCKS} b, e WHERE b.execution_id = e.id AND b.metric > names.metric
          ORDER BY b.metric LIMIT 1)
  FROM names WHERE names.metric IS NOT NULL
)
SELECT metric FROM names WHERE metric IS NOT NULL LIMIT %s
"""


def metric_names(xid: int, wid: int, limit: int = 50) -> list[str]:
    """The metrics the work unit's current (newest) execution has points of, by name, at most ``limit``."""
    with connection.cursor() as cursor:
        cursor.execute(_METRIC_NAMES_SQL, [xid, wid, limit])
        return [row[0] for row in cursor.fetchall()]
