"""GetChartData's bulk encoding of series points (`metrics.wire.series_points_wire`) and the binary
array reads behind it (`metrics.data`): the same message as one built point by point."""
from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import pb
from metrics import data, services, wire
from tests import factories

M = pb.dashboard

_steps = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_times = st.floats(min_value=0, max_value=4e9, allow_nan=False)  # unix seconds, to the year 2096
_values = st.floats(allow_nan=False)  # infinities included: a double is a double on the wire
_points = st.lists(st.tuples(_steps, _times, _values, _values, _values), max_size=50)


def _one_by_one(points: list[tuple[int, float, float, float, float]]) -> object:
    message = M.ChartData.SeriesData()
    for step, time_s, avg, low, high in points:
        seconds = math.floor(time_s)
        message.points.add(step=step, avg_value=avg, min_value=low, max_value=high,
                           timestamp={"seconds": seconds, "nanos": min(int((time_s - seconds) * 1e9), 999_999_999)})
    return message


@given(_points)
def test_it_parses_the_bulk_encoding_to_the_message_built_point_by_point(points) -> None:
    columns = list(zip(*points)) if points else [[]] * 5
    blob = wire.series_points_wire(*columns)
    assert len(blob) == len(points) * wire.POINT_WIRE_LENGTH
    parsed = M.ChartData.SeriesData()
    parsed.MergeFromString(blob)
    assert parsed == _one_by_one(points)


def test_it_round_trips_the_extremes_of_each_field() -> None:
    points = [(0, 0.0, 0.0, -0.0, 0.0), (-1, 1.9999999995, -1e308, math.inf, -math.inf),
              (2**63 - 1, 4e9 + 0.5, 5e-324, 1.0, 2.0), (-(2**63), 12.25, 1.0, 1.0, 1.0)]
    parsed = M.ChartData.SeriesData()
    parsed.MergeFromString(wire.series_points_wire(*zip(*points)))
    assert [(p.step, p.timestamp.seconds, p.timestamp.nanos) for p in parsed.points] == [
        (0, 0, 0), (-1, 1, 999_999_999), (2**63 - 1, 4_000_000_000, 500_000_000), (-(2**63), 12, 250_000_000)]
    assert parsed == _one_by_one(points)


def test_it_sends_a_canonical_answer_out_on_the_wire() -> None:
    """Varints are padded in the bulk bytes; the message, once parsed, serializes as protobuf would."""
    points = [(3, 1.5, 0.25, 0.0, 1.0)]
    parsed = M.ChartData.SeriesData()
    parsed.MergeFromString(wire.series_points_wire(*zip(*points)))
    assert parsed.SerializeToString() == _one_by_one(points).SerializeToString()
    assert len(parsed.SerializeToString()) < wire.POINT_WIRE_LENGTH


@pytest.mark.django_db
def test_it_reads_numpy_arrays_for_a_blocked_chart_and_answers_every_block() -> None:
    """A series read from blocks comes as numpy arrays straight from the binary rows, and its answer
    is the blocks' values, point for point."""
    unit = factories.work_unit(factories.experiment())
    execution = unit.executions.get()
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    services.write_points(execution.pk, [services.Point("loss", s, float(s % 7), t0 + timedelta(seconds=s))
                                         for s in range(20_000)])
    plot = M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]))
    read, _ = data._series(data.Scope(unit.experiment_id, unit.wid), plot, 100)
    (columns,) = read.values()
    assert isinstance(columns.steps, np.ndarray) and columns.steps.dtype == np.int64
    assert isinstance(columns.avgs, np.ndarray) and columns.avgs.dtype == np.float64
    size = data.block_size(20_000, 100)
    assert size is not None and len(columns) == math.ceil(20_000 / size)
    (entry,) = data.plot_data(data.Scope(unit.experiment_id, unit.wid), plot, 100)
    points = entry.scatter_series.points
    assert [p.step for p in points] == columns.steps.tolist()
    first = [float(s % 7) for s in range(size)]
    assert (points[0].min_value, points[0].max_value) == (min(first), max(first))
    assert points[0].avg_value == pytest.approx(sum(first) / size)
    assert points[-1].timestamp.ToDatetime(tzinfo=timezone.utc) == t0 + timedelta(seconds=19_999)
