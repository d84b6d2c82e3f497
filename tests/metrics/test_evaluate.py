"""The numerics of GetChartData against hand-computed values, and their properties."""
from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metrics import evaluate
from metrics.evaluate import Bucket


def _series(values: list[float]) -> list[Bucket]:
    return [Bucket(step, float(step), v, v, v) for step, v in enumerate(values)]


def test_it_computes_exponential_smoothing_as_by_hand() -> None:
    # s0 = 10; s1 = .5*20 + .5*10 = 15; s2 = .5*0 + .5*15 = 7.5
    assert evaluate.exponential([10, 20, 0], 0.5) == [10, 15, 7.5]


def test_it_computes_a_moving_average_as_by_hand() -> None:
    assert evaluate.moving_average([1, 2, 3, 4, 5], 2) == [1, 1.5, 2.5, 3.5, 4.5]
    assert evaluate.moving_average([3, 6, 9], 10) == [3, 4.5, 6]


def test_it_computes_holt_as_by_hand() -> None:
    # level0 = 1, trend0 = 1; t=1: level = .5*2 + .5*(1+1) = 2, trend = .5*(2-1) + .5*1 = 1
    # t=2: level = .5*3 + .5*3 = 3, trend = 1 -> forecasts 4, 5
    assert evaluate.holt([1, 2, 3], 0.5, 0.5, 2) == [4, 5]
    ahead = evaluate.forecast(_series([1, 2, 3]), 0.5, 0.5, 2)
    assert [(b.step, b.avg) for b in ahead] == [(3, 4), (4, 5)]


def test_it_aggregates_across_work_units_as_by_hand() -> None:
    a, b, c = _series([1, 2]), _series([3, 4]), _series([8])
    assert [x.avg for x in evaluate.aggregate([a, b, c], "MEAN")] == [4, 3]
    assert [x.avg for x in evaluate.aggregate([a, b, c], "MEDIAN")] == [3, 3]
    assert [x.avg for x in evaluate.aggregate([a, b, c], "SUM")] == [12, 6]
    assert [x.avg for x in evaluate.aggregate([a, b, c], "MIN")] == [1, 2]
    assert [x.avg for x in evaluate.aggregate([a, b, c], "MAX")] == [8, 4]
    (first, second) = evaluate.aggregate([a, b, c], "MEAN_CI_95")
    half = 1.96 * statistics.stdev([1, 3, 8]) / math.sqrt(3)
    assert (first.avg, first.min, first.max) == pytest.approx((4, 4 - half, 4 + half))


def test_it_clips_and_labels_bins() -> None:
    clipped = evaluate.clip([Bucket(0, 0, 5, -3, 12)], 0, 10)
    assert (clipped[0].avg, clipped[0].min, clipped[0].max) == (5, 0, 10)
    assert evaluate.bin_labels(0, 10, 2) == ["[0, 5)", "[5, 10]"]
    assert evaluate.bin_labels(3, 3, 20) == ["[3, 3]"]


VALUES = st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60)


@given(VALUES, st.floats(0.01, 1))
def test_it_keeps_exponential_smoothing_within_the_range_of_its_input(values: list[float], alpha: float) -> None:
    smoothed = evaluate.exponential(values, alpha)
    assert len(smoothed) == len(values)
    assert all(min(values) - 1e-6 <= s <= max(values) + 1e-6 for s in smoothed)


@given(VALUES, st.integers(1, 20))
def test_it_gives_the_constant_as_the_moving_average_of_a_constant(values: list[float], window: int) -> None:
    constant = [values[0]] * len(values)
    assert evaluate.moving_average(constant, window) == pytest.approx(constant)


@given(st.floats(-1e3, 1e3), st.floats(-10, 10), st.integers(3, 30), st.floats(0.05, 1), st.floats(0.05, 1))
def test_it_continues_a_straight_line_exactly_with_holt(start: float, slope: float, n: int, alpha: float, beta: float) -> None:
    line = [start + slope * i for i in range(n)]
    assert evaluate.holt(line, alpha, beta, 3) == pytest.approx([start + slope * (n - 1 + h) for h in (1, 2, 3)],
                                                               abs=1e-6)


@given(st.lists(VALUES, min_size=1, max_size=5))
def test_it_gives_aggregates_that_lie_between_the_min_and_the_max(values: list[list[float]]) -> None:
    series = [_series(v) for v in values]
    low, high = evaluate.aggregate(series, "MIN"), evaluate.aggregate(series, "MAX")
    for how in ("MEAN", "MEDIAN"):
        for lo, mid, hi in zip(low, evaluate.aggregate(series, how), high):
            assert lo.avg - 1e-6 <= mid.avg <= hi.avg + 1e-6
