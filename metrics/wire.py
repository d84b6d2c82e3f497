"""Chart and Dashboard rows as ``cloud.xmanager.v1`` messages (the one place their wire shape is decided)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf.descriptor import FieldDescriptor

from core import pb
from core.convert import from_json, parse_list, set_if, timestamp
from metrics.models import Chart, Dashboard


def chart_to_proto(chart: Chart) -> pb.dashboard.Chart:
    message = pb.dashboard.Chart(
        name=chart.name,
        title=chart.title,
        description=chart.description,
        xid=chart.experiment_id,
        wid=chart.work_unit.wid,
        plots=parse_list(pb.dashboard.PlotSpec, chart.plots),
    )
    if chart.plot_layout:
        message.plot_layout.CopyFrom(from_json(pb.dashboard.LayoutSpec, chart.plot_layout))
    set_if(message, "create_time", timestamp(chart.create_time))
    set_if(message, "update_time", timestamp(chart.update_time))
    return message


def dashboard_to_proto(dashboard: Dashboard, chart_ids: Sequence[str]) -> pb.dashboard.Dashboard:
    message = pb.dashboard.Dashboard(
        name=dashboard.name,
        title=dashboard.title,
        description=dashboard.description,
        owner=dashboard.owner,
        chart_ids=list(chart_ids),
    )
    if dashboard.chart_layout:
        message.chart_layout.CopyFrom(from_json(pb.dashboard.LayoutSpec, dashboard.chart_layout))
    set_if(message, "create_time", timestamp(dashboard.create_time))
    set_if(message, "update_time", timestamp(dashboard.update_time))
    return message


# --- GetChartData's series points, encoded in bulk --------------------------------------------------
#
# A chart of 100 work units at 1,000 px answers ~100,000 `ChartData.SeriesPoint`s; built one by one
# through the message API that is ~1 us each, the larger part of the call. Their wire bytes are instead
# made with numpy for all of them at once (each field's tag read from the descriptor, not written by
# hand) and parsed into the `SeriesData` by the protobuf runtime (`MergeFromString`), which checks them.

_SERIES_DATA = pb.dashboard.ChartData.SeriesData.DESCRIPTOR
_SERIES_POINT = pb.dashboard.ChartData.SeriesPoint.DESCRIPTOR
_TIMESTAMP = _SERIES_POINT.fields_by_name["timestamp"].message_type
_VARINT, _FIXED64, _LENGTH_DELIMITED = 0, 1, 2


def _tag(field: FieldDescriptor, wire_type: int) -> int:
    tag = field.number << 3 | wire_type
    assert tag < 0x80, field.full_name  # a one-byte tag, as every field encoded here has
    return tag


_POINTS_TAG = _tag(_SERIES_DATA.fields_by_name["points"], _LENGTH_DELIMITED)
_STEP_TAG = _tag(_SERIES_POINT.fields_by_name["step"], _VARINT)
_TIME_TAG = _tag(_SERIES_POINT.fields_by_name["timestamp"], _LENGTH_DELIMITED)
_SECONDS_TAG = _tag(_TIMESTAMP.fields_by_name["seconds"], _VARINT)
_NANOS_TAG = _tag(_TIMESTAMP.fields_by_name["nanos"], _VARINT)
_VALUE_TAGS = [_tag(_SERIES_POINT.fields_by_name[name], _FIXED64) for name in ("avg_value", "min_value", "max_value")]
# Every varint is written at a fixed width (a value padded with continuation bits, which every protobuf
# parser takes: a varint is up to 10 bytes), so all points have the same length and the bytes are
# one (points x record) matrix. The parsed message re-encodes canonically when it is sent.
_STEP_WIDTH, _SECONDS_WIDTH, _NANOS_WIDTH = 10, 10, 5  # int64 and int64 in full; nanos < 2**35
_TIME_LENGTH = 1 + _SECONDS_WIDTH + 1 + _NANOS_WIDTH
_POINT_LENGTH = 1 + _STEP_WIDTH + 2 + _TIME_LENGTH + 3 * 9
_RECORD = 2 + _POINT_LENGTH  # with the entry's own tag and length
assert _POINT_LENGTH < 0x80  # a one-byte length


def _varint_into(out: npt.NDArray[np.uint8], values: npt.NDArray[np.int64]) -> None:
    """Write int64 ``values`` (two's complement, as protobuf's int64) as varints as wide as the columns
    of ``out``, 7 bits a column."""
    rest = values.view(np.uint64).copy()
    for column in range(out.shape[1]):
        last = column == out.shape[1] - 1
        out[:, column] = (rest & np.uint64(0x7F)) | np.uint64(0 if last else 0x80)
        rest >>= np.uint64(7)


def series_points_wire(steps: npt.ArrayLike, times: npt.ArrayLike, avgs: npt.ArrayLike, mins: npt.ArrayLike,
                       maxs: npt.ArrayLike) -> bytes:
    """The ``SeriesData.points`` entries of the points given (times in unix seconds) as wire bytes:
    `POINT_WIRE_LENGTH` bytes a point, in order."""
    step = np.asarray(steps, dtype=np.int64)
    time_s = np.asarray(times, dtype=np.float64)
    seconds = np.floor(time_s)
    nanos = np.minimum(((time_s - seconds) * 1e9).astype(np.int64), 999_999_999)
    out = np.empty((len(step), _RECORD), dtype=np.uint8)  # a row per point
    at = 0

    def put(width: int) -> npt.NDArray[np.uint8]:
        nonlocal at
        at += width
        return out[:, at - width:at]

    put(1)[:] = _POINTS_TAG
    put(1)[:] = _POINT_LENGTH
    put(1)[:] = _STEP_TAG
    _varint_into(put(_STEP_WIDTH), step)
    put(1)[:] = _TIME_TAG
    put(1)[:] = _TIME_LENGTH
    put(1)[:] = _SECONDS_TAG
    _varint_into(put(_SECONDS_WIDTH), seconds.astype(np.int64))
    put(1)[:] = _NANOS_TAG
    _varint_into(put(_NANOS_WIDTH), nanos)
    for tag, values in zip(_VALUE_TAGS, (avgs, mins, maxs)):
        put(1)[:] = tag
        put(8)[:] = np.asarray(values, dtype="<f8")[:, None].view(np.uint8)
    assert at == _RECORD
    return out.tobytes()


#: The bytes each point takes in `series_points_wire`'s answer.
POINT_WIRE_LENGTH = _RECORD
