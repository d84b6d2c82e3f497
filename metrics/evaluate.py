"""The numerics of GetChartData: pure functions over a series' buckets (no ORM, no clock).

`metrics.data` reads the points (already bucketed to the chart's width in
SQL) and hands each series here as `Bucket` rows; these functions smooth,
forecast, aggregate across work units, summarize and bin them. What works on
whole columns is numpy: the moving average (a difference of cumulative
sums), the aggregation across work units (a series x steps matrix, NaN where
a series has no point, reduced along the series with numpy's nan-aware
reductions) and clipping. The exponential smoothing and Holt's method are
recurrences, each value depending on the one before: they stay loops.
Every one is tested against hand-computed values and properties
(tests/metrics/test_evaluate.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt


class Bucket(NamedTuple):
    """One point of a series: a raw point (min = avg = max) or a bucket of several.

    A tuple: a chart of 100 work units at 1,000 px makes 100,000 of them per call.
    """

    step: int
    time_s: float  # unix seconds
    avg: float
    min: float
    max: float


#: Defaults for parameters a spec leaves at 0.
DEFAULT_SMOOTH_ALPHA = 0.6
DEFAULT_WINDOW = 10
DEFAULT_FORECAST_ALPHA = 0.5
DEFAULT_FORECAST_BETA = 0.3


def exponential(values: Sequence[float], alpha: float) -> list[float]:
    """s_0 = x_0, s_t = alpha * x_t + (1 - alpha) * s_(t-1)."""
    out: list[float] = []
    for value in values:
        out.append(value if not out else alpha * value + (1 - alpha) * out[-1])
    return out


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The trailing mean of the last ``window`` values (fewer at the start)."""
    x = np.asarray(values, dtype=np.float64)
    total = np.cumsum(x)
    total[window:] = total[window:] - total[:-window]
    return (total / np.minimum(np.arange(1, len(x) + 1), window)).tolist()


def smooth(series: Sequence[Bucket], smoother: Callable[[Sequence[float]], list[float]]) -> list[Bucket]:
    """Apply ``smoother`` to the avg, min and max columns alike."""
    avg = smoother([b.avg for b in series])
    low = smoother([b.min for b in series])
    high = smoother([b.max for b in series])
    return [b._replace(avg=a, min=lo, max=hi) for b, a, lo, hi in zip(series, avg, low, high)]


def holt(values: Sequence[float], alpha: float, beta: float, ahead: int) -> list[float]:
    """Holt's linear method: the ``ahead`` forecasts after ``values``.

    level_0 = x_0, trend_0 = x_1 - x_0; then for t >= 1
    level_t = alpha x_t + (1 - alpha)(level_(t-1) + trend_(t-1)),
    trend_t = beta (level_t - level_(t-1)) + (1 - beta) trend_(t-1);
    forecast_h = level_T + h trend_T.
    """
    if not values:
        return []
    level, trend = values[0], (values[1] - values[0]) if len(values) > 1 else 0.0
    for value in values[1:]:
        previous = level
        level = alpha * value + (1 - alpha) * (level + trend)
        trend = beta * (level - previous) + (1 - beta) * trend
    return [level + h * trend for h in range(1, ahead + 1)]


def forecast(series: Sequence[Bucket], alpha: float, beta: float, ahead: int) -> list[Bucket]:
    """``ahead`` forecast buckets after ``series``, spaced like its steps and times on average."""
    if not series:
        return []
    values = holt([b.avg for b in series], alpha, beta, ahead)
    last = series[-1]
    n = len(series)
    step_gap = max(1, round((last.step - series[0].step) / (n - 1))) if n > 1 else 1
    time_gap = (last.time_s - series[0].time_s) / (n - 1) if n > 1 else 0.0
    return [Bucket(last.step + h * step_gap, last.time_s + h * time_gap, v, v, v) for h, v in enumerate(values, 1)]


_AGGREGATES: dict[str, Callable[..., npt.NDArray[np.float64]]] = {
    "MEAN": np.nanmean,
    "MEDIAN": np.nanmedian,
    "MIN": np.nanmin,
    "MAX": np.nanmax,
    "SUM": np.nansum,
}


def aggregate(series: Sequence[Sequence[Bucket]], how: str) -> list[Bucket]:
    """One series from several (one per work unit), step by step, over the series present at each step.

    MEAN, MEDIAN, MIN, MAX, SUM of the avg column; MEAN_CI_95 gives the mean
    with min/max the bounds of its 95 % confidence interval (1.96 standard
    errors; none with one series at that step). Each step's time is the
    latest of its buckets.
    """
    steps = np.unique(np.fromiter((b.step for one in series for b in one), dtype=np.int64))
    if not len(steps):
        return []
    values = np.full((len(series), len(steps)), np.nan)
    times = np.full((len(series), len(steps)), np.nan)
    for row, one in enumerate(series):
        if one:
            at = np.searchsorted(steps, [b.step for b in one])
            values[row, at] = [b.avg for b in one]
            times[row, at] = [b.time_s for b in one]
    latest = np.nanmax(times, axis=0)
    if how == "MEAN_CI_95":
        present = np.count_nonzero(~np.isnan(values), axis=0)
        mean = np.nanmean(values, axis=0)
        spread = np.zeros(len(steps))
        several = present >= 2
        spread[several] = np.nanstd(values[:, several], axis=0, ddof=1)
        half = 1.96 * spread / np.sqrt(present)
        low, high = mean - half, mean + half
    else:
        mean = _AGGREGATES[how](values, axis=0)
        low = high = mean
    return [Bucket(*row) for row in zip(steps.tolist(), latest.tolist(), mean.tolist(), low.tolist(), high.tolist())]


def clip(series: Sequence[Bucket], low: float, high: float) -> list[Bucket]:
    """Clamp every column into [low, high] (the plot's y_min/y_max)."""
    if not series:
        return []
    columns: Any = np.clip(np.array([(b.avg, b.min, b.max) for b in series], dtype=np.float64), low, high)
    return [b._replace(avg=a, min=lo, max=hi) for b, (a, lo, hi) in zip(series, columns.tolist())]


def bin_labels(low: float, high: float, bins: int) -> list[str]:
    """Labels of ``bins`` equal-width bins over [low, high]: "[lo, hi)", the last one closed."""
    if low == high:
        return [f"[{low:g}, {high:g}]"]
    width = (high - low) / bins
    return [f"[{low + i * width:g}, {low + (i + 1) * width:g}{']' if i == bins - 1 else ')'}" for i in range(bins)]
