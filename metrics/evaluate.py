"""The numerics of GetChartData: pure functions over plain lists (no ORM, no clock).

`metrics.data` reads the points (already bucketed to the chart's width in
SQL) and hands each series here as `Bucket` rows; these functions smooth,
forecast, aggregate across work units, summarize and bin them. Every one is
tested against hand-computed values (tests/metrics/test_evaluate.py).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import NamedTuple


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
    out: list[float] = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


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


def _ci95(values: Sequence[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


_AGGREGATES: dict[str, Callable[[Sequence[float]], float]] = {
    "MEAN": statistics.fmean,
    "MEDIAN": statistics.median,
    "MIN": min,
    "MAX": max,
    "SUM": math.fsum,
}


def aggregate(series: Sequence[Sequence[Bucket]], how: str) -> list[Bucket]:
    """One series from several (one per work unit), step by step, over the series present at each step.

    MEAN, MEDIAN, MIN, MAX, SUM of the avg column; MEAN_CI_95 gives the mean
    with min/max the bounds of its 95 % confidence interval (1.96 standard errors).
    """
    by_step: dict[int, list[Bucket]] = {}
    for one in series:
        for bucket in one:
            by_step.setdefault(bucket.step, []).append(bucket)
    out = []
    for step in sorted(by_step):
        group = by_step[step]
        values = [b.avg for b in group]
        time_s = max(b.time_s for b in group)
        if how == "MEAN_CI_95":
            mean, low, high = _ci95(values)
            out.append(Bucket(step, time_s, mean, low, high))
        else:
            value = _AGGREGATES[how](values)
            out.append(Bucket(step, time_s, value, value, value))
    return out


def clip(series: Sequence[Bucket], low: float, high: float) -> list[Bucket]:
    """Clamp every column into [low, high] (the plot's y_min/y_max)."""
    def c(v: float) -> float:
        return min(max(v, low), high)

    return [b._replace(avg=c(b.avg), min=c(b.min), max=c(b.max)) for b in series]


def bin_labels(low: float, high: float, bins: int) -> list[str]:
    """Labels of ``bins`` equal-width bins over [low, high]: "[lo, hi)", the last one closed."""
    if low == high:
        return [f"[{low:g}, {high:g}]"]
    width = (high - low) / bins
    return [f"[{low + i * width:g}, {low + (i + 1) * width:g}{']' if i == bins - 1 else ')'}" for i in range(bins)]
