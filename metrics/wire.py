"""Chart and Dashboard rows as ``cloud.xmanager.v1`` messages (the one place their wire shape is decided)."""
from __future__ import annotations

from collections.abc import Sequence

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
