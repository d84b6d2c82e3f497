"""The DashboardService over the real gRPC server: charts and dashboards, access, masks, lists, data."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from core import pb
from metrics import services
from metrics.models import Dashboard
from tests import factories
from tests.metrics.conftest import chart_message, experiment_for, scatter, write
from workunits import services as wu_services
from workunits.models import WorkUnit

pytestmark = pytest.mark.django_db(transaction=True)

D = pb.dashboard_api
M = pb.dashboard
Persona = Callable[[str], tuple[str, list[tuple[str, str]]]]


def _code(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_it_lists_the_service_in_reflection_and_health(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in replies[0].list_services_response.service}
    assert "cloud.xmanager.v1.DashboardService" in names
    health = health_pb2_grpc.HealthStub(channel)
    answer = health.Check(health_pb2.HealthCheckRequest(service="cloud.xmanager.v1.DashboardService"))
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_it_refuses_a_call_without_a_token_saying_what_to_use(dash: Any) -> None:
    code, details = _code(lambda: dash.ListDashboards(D.ListDashboardsRequest()))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "xdash" in details and "XMC_AUTH_TOKEN" in details


def test_it_creates_gets_lists_updates_and_deletes_a_chart(dash: Any, persona: Persona) -> None:
    alice, as_alice = persona("alice")
    exp = experiment_for(alice)
    factories.work_unit(exp, wid=1)
    parent = f"experiments/{exp.id}/workUnits/1"
    created = dash.CreateChart(D.CreateChartRequest(parent=parent, chart=chart_message(), chart_id="loss_1"),
                               metadata=as_alice)
    assert created.name == f"{parent}/charts/loss_1"
    assert (created.xid, created.wid, created.title) == (exp.id, 1, "Loss")
    assert created.plots[0].data.metrics == ["loss"] and created.HasField("create_time")
    # A retried create answers the same chart; another with the same id is refused.
    again = dash.CreateChart(D.CreateChartRequest(parent=parent, chart=chart_message(), chart_id="loss_1"),
                             metadata=as_alice)
    assert again == created
    code, _ = _code(lambda: dash.CreateChart(D.CreateChartRequest(parent=parent, chart=chart_message(title="Other"),
                                                                  chart_id="loss_1"), metadata=as_alice))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    # Server-chosen ids are UUIDs.
    generated = dash.CreateChart(D.CreateChartRequest(parent=parent, chart=chart_message()), metadata=as_alice)
    assert len(generated.name.rsplit("/", 1)[1]) == 36
    # Every name shape reads the same chart.
    for name in (created.name, "charts/loss_1"):
        assert dash.GetChart(D.GetChartRequest(name=name), metadata=as_alice) == created
    listed = dash.ListCharts(D.ListChartsRequest(parent=parent, page_size=1), metadata=as_alice)
    assert [c.name for c in listed.charts] == [created.name] and listed.next_page_token
    rest = dash.ListCharts(D.ListChartsRequest(parent=parent, page_size=1, page_token=listed.next_page_token),
                           metadata=as_alice)
    assert [c.name for c in rest.charts] == [generated.name]
    # Update masks are honoured; unknown and fixed paths are refused, naming the mask.
    updated = dash.UpdateChart(D.UpdateChartRequest(
        chart=M.Chart(name=created.name, title="Val loss", description="ignored"),
        update_mask=field_mask_pb2.FieldMask(paths=["title"])), metadata=as_alice)
    assert (updated.title, updated.description, list(updated.plots)) == ("Val loss", "", list(created.plots))
    for path in ("bogus", "xid"):
        code, details = _code(lambda: dash.UpdateChart(D.UpdateChartRequest(
            chart=M.Chart(name=created.name), update_mask=field_mask_pb2.FieldMask(paths=[path])), metadata=as_alice))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "update_mask" in details
    dash.DeleteChart(D.DeleteChartRequest(name="charts/loss_1"), metadata=as_alice)
    code, _ = _code(lambda: dash.GetChart(D.GetChartRequest(name=created.name), metadata=as_alice))
    assert code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("plot,field", [
    (M.PlotSpec(plot_id="p", type=M.SCATTER), "chart.plots[0].data.metrics"),
    (M.PlotSpec(plot_id="p", type=17, data=M.DataSpec(metrics=["x"])), "chart.plots[0].type"),
    (M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(
        metrics=["x"], ranges=[M.DataSpec.DataRange(start_step=10, end_step=5)])), "chart.plots[0].data.ranges[0].end_step"),
    (M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["x"] * 101)), "chart.plots[0].data.metrics"),
    (M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["x"]),
                stats=M.StatSpec(type=M.StatSpec.FORECAST)), "chart.plots[0].stats.forecast.steps_ahead"),
    (M.PlotSpec(plot_id="bad id", type=M.SCATTER, data=M.DataSpec(metrics=["x"])), "chart.plots[0].plot_id"),
])
def test_it_refuses_bad_specs_naming_the_field(dash: Any, persona: Persona, plot: Any, field: str) -> None:
    alice, as_alice = persona("alice")
    exp = experiment_for(alice)
    factories.work_unit(exp, wid=1)
    with pytest.raises(grpc.RpcError) as info:
        dash.CreateChart(D.CreateChartRequest(parent=f"experiments/{exp.id}/workUnits/1",
                                              chart=M.Chart(title="t", plots=[plot])), metadata=as_alice)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()
    trailer = dict(info.value.trailing_metadata())["grpc-status-details-bin"]
    status = pb.rpc_status.Status.FromString(trailer)
    assert field.encode() in status.details[0].value


def test_it_makes_a_chart_follow_its_experiments_acls(dash: Any, persona: Persona) -> None:
    alice, as_alice = persona("alice")
    bob, as_bob = persona("bob")  # reader
    _, as_eve = persona("eve")  # stranger
    exp = experiment_for(alice, readers=(bob,))
    factories.work_unit(exp, wid=1)
    parent = f"experiments/{exp.id}/workUnits/1"
    chart = dash.CreateChart(D.CreateChartRequest(parent=parent, chart=chart_message()), metadata=as_alice)
    assert dash.GetChart(D.GetChartRequest(name=chart.name), metadata=as_bob) == chart
    # A stranger gets the same answer for the chart and for a chart that does not exist.
    code, seen = _code(lambda: dash.GetChart(D.GetChartRequest(name=chart.name), metadata=as_eve))
    missing_code, missing = _code(lambda: dash.GetChart(D.GetChartRequest(name=f"{parent}/charts/nope"),
                                                        metadata=as_eve))
    assert code == missing_code == grpc.StatusCode.PERMISSION_DENIED
    assert seen.replace(chart.name, "X") == missing.replace(f"{parent}/charts/nope", "X")
    code, _ = _code(lambda: dash.GetChartData(D.GetChartDataRequest(name=chart.name), metadata=as_eve))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    # A reader may not change another's chart, and gets NOT_FOUND for a missing one.
    code, _ = _code(lambda: dash.DeleteChart(D.DeleteChartRequest(name=chart.name), metadata=as_bob))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    code, _ = _code(lambda: dash.GetChart(D.GetChartRequest(name=f"{parent}/charts/nope"), metadata=as_bob))
    assert code == grpc.StatusCode.NOT_FOUND
    # A reader may create a chart (a view), and change it.
    own = dash.CreateChart(D.CreateChartRequest(parent=parent, chart=chart_message()), metadata=as_bob)
    dash.DeleteChart(D.DeleteChartRequest(name=own.name), metadata=as_bob)


def test_it_makes_a_dashboard_its_owners_and_readable_by_the_experiments_readers(dash: Any, persona: Persona) -> None:
    alice, as_alice = persona("alice")
    bob, as_bob = persona("bob")
    _, as_eve = persona("eve")
    exp = experiment_for(alice, readers=(bob,))
    factories.work_unit(exp, wid=1)
    chart = dash.CreateChart(D.CreateChartRequest(parent=f"experiments/{exp.id}/workUnits/1", chart=chart_message(),
                                                  chart_id=f"c{exp.id}"), metadata=as_alice)
    inline = chart_message(title="Inline")
    inline.xid, inline.wid = exp.id, 1
    created = dash.CreateDashboard(D.CreateDashboardRequest(
        dashboard=M.Dashboard(title="Runs", chart_ids=[f"c{exp.id}"]), dashboard_id=f"d{exp.id}", charts=[inline]),
        metadata=as_alice)
    assert created.name == f"dashboards/d{exp.id}" and created.owner == alice
    assert created.chart_ids[0] == f"c{exp.id}" and len(created.chart_ids) == 2
    assert dash.GetDashboard(D.GetDashboardRequest(name=created.name), metadata=as_bob) == created
    code, _ = _code(lambda: dash.GetDashboard(D.GetDashboardRequest(name=created.name), metadata=as_eve))
    assert code == grpc.StatusCode.NOT_FOUND  # as a missing one (tests/security/test_chart_ids.py)
    code, _ = _code(lambda: dash.DeleteDashboard(D.DeleteDashboardRequest(name=created.name), metadata=as_bob))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    # Lists: only what the caller may read; the filter xm_cloud sends; paging.
    mine = dash.ListDashboards(D.ListDashboardsRequest(filter=f"charts.experiment_id={exp.id}"), metadata=as_bob)
    assert [d.name for d in mine.dashboards] == [created.name]
    assert not dash.ListDashboards(D.ListDashboardsRequest(), metadata=as_eve).dashboards
    assert not dash.ListDashboards(D.ListDashboardsRequest(filter="charts.experiment_id=1"),
                                   metadata=as_alice).dashboards
    code, details = _code(lambda: dash.ListDashboards(D.ListDashboardsRequest(filter="nope=1"), metadata=as_alice))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "nope" in details
    # A chart id nobody may read is refused like a missing one.
    eve_exp = experiment_for("someone-else@example.com")
    factories.work_unit(eve_exp, wid=1)
    code, details = _code(lambda: dash.CreateDashboard(D.CreateDashboardRequest(
        dashboard=M.Dashboard(title="x", chart_ids=["missing"])), metadata=as_alice))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "dashboard.chart_ids[0]" in details
    # Update: masks honoured, unknown paths refused; the owner deletes.
    updated = dash.UpdateDashboard(D.UpdateDashboardRequest(
        dashboard=M.Dashboard(name=created.name, title="Renamed", chart_ids=[created.chart_ids[1]]),
        update_mask=field_mask_pb2.FieldMask(paths=["title", "chart_ids"])), metadata=as_alice)
    assert (updated.title, list(updated.chart_ids)) == ("Renamed", [created.chart_ids[1]])
    code, _ = _code(lambda: dash.UpdateDashboard(D.UpdateDashboardRequest(
        dashboard=M.Dashboard(name=created.name), update_mask=field_mask_pb2.FieldMask(paths=["owner"])),
        metadata=as_alice))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert [c.name for c in dash.ListCharts(D.ListChartsRequest(parent=created.name), metadata=as_bob).charts] == [
        f"experiments/{exp.id}/workUnits/1/charts/{created.chart_ids[1]}"]
    dash.DeleteDashboard(D.DeleteDashboardRequest(name=created.name), metadata=as_alice)
    code, _ = _code(lambda: dash.GetDashboard(D.GetDashboardRequest(name=created.name), metadata=as_alice))
    assert code == grpc.StatusCode.NOT_FOUND


def test_it_answers_get_chart_data_with_series_summaries_and_bounded_downsampling(dash: Any, persona: Persona) -> None:
    alice, as_alice = persona("alice")
    exp = experiment_for(alice)
    wu = factories.work_unit(exp, wid=1)
    factories.work_unit(exp, wid=2)
    write(wu, "loss", [float(v) for v in range(5000)])
    write(WorkUnit.objects.get(experiment=exp, wid=2), "loss", [1.0, 3.0, 5.0])
    plots = [
        scatter("raw", "loss"),
        M.PlotSpec(plot_id="kpi", type=M.SUMMARY_BOX, data=M.DataSpec(metrics=["loss"])),
        scatter("mean", "loss", stats=M.StatSpec(aggregation=M.StatSpec.MEAN)),
    ]
    plots[2].data.CopyFrom(M.DataSpec(metrics=["loss"], ranges=[M.DataSpec.DataRange(end_step=2)]))
    chart = dash.CreateChart(D.CreateChartRequest(parent=f"experiments/{exp.id}/workUnits/1",
                                                  chart=chart_message(*plots)), metadata=as_alice)
    data = dash.GetChartData(D.GetChartDataRequest(name=chart.name, chart_width_pixels=100), metadata=as_alice)
    by_plot: dict[str, list[Any]] = {}
    for entry in data.plots_data:
        by_plot.setdefault(entry.plot_id, []).append(entry)
    (raw,) = by_plot["raw"]
    series = raw.scatter_series
    assert series.metric_name == "loss" and series.work_unit_id == "1"
    assert 50 <= len(series.points) <= 100  # bounded by the width, not by the 5000 points stored
    assert series.points[0].min_value == 0.0 and series.points[-1].max_value == 4999.0
    # 50 steps a pixel: read in 64-step blocks, one a bucket (metrics.data.block_size).
    assert [p.avg_value for p in series.points] == pytest.approx(
        [(64 * i + min(64 * i + 63, 4999)) / 2 for i in range(len(series.points))])
    (kpi,) = by_plot["kpi"]
    assert (kpi.summary_data.latest_value, kpi.summary_data.min_value, kpi.summary_data.max_value,
            kpi.summary_data.latest_step) == (4999.0, 0.0, 4999.0, 4999)
    assert kpi.summary_data.mean_value == pytest.approx(2499.5)
    # Over the whole experiment, aggregated across work units step by step.
    across = dash.GetChartData(D.GetChartDataRequest(name=chart.name, parent_experiment=f"experiments/{exp.id}"),
                               metadata=as_alice)
    (mean,) = [e for e in across.plots_data if e.plot_id == "mean"]
    assert [(p.step, p.avg_value) for p in mean.scatter_series.points] == [(0, 0.5), (1, 2.0), (2, 3.5)]
    code, details = _code(lambda: dash.GetChartData(D.GetChartDataRequest(name=chart.name, chart_width_pixels=-1),
                                                    metadata=as_alice))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "chart_width_pixels" in details


def test_it_lets_the_principal_read_a_dashboard_shared_through_its_acls(dash: Any, persona: Persona) -> None:
    alice, as_alice = persona("alice")
    carol, as_carol = persona("carol")
    made = dash.CreateDashboard(D.CreateDashboardRequest(dashboard=M.Dashboard(title="Empty")), metadata=as_alice)
    code, _ = _code(lambda: dash.GetDashboard(D.GetDashboardRequest(name=made.name), metadata=as_carol))
    assert code == grpc.StatusCode.NOT_FOUND
    services.set_dashboard_acls(Dashboard.objects.get(dashboard_id=made.name.split("/")[1]),
                                {"readers": [{"user": carol.upper()}]})
    assert dash.GetDashboard(D.GetDashboardRequest(name=made.name), metadata=as_carol).title == "Empty"
    names = [d.name for d in dash.ListDashboards(D.ListDashboardsRequest(), metadata=as_carol).dashboards]
    assert names == [made.name]
    code, _ = _code(lambda: dash.DeleteDashboard(D.DeleteDashboardRequest(name=made.name), metadata=as_carol))
    assert code == grpc.StatusCode.PERMISSION_DENIED


def test_it_evaluates_each_stat_and_plot_type_in_get_chart_data(dash: Any, persona: Persona) -> None:
    alice, as_alice = persona("alice")
    exp = experiment_for(alice)
    wu = factories.work_unit(exp, wid=1)
    write(wu, "loss", [4.0, 2.0, 1.0, 3.0])  # steps 0..3, one second apart
    S = M.StatSpec
    plots = [
        scatter("ema", "loss", stats=S(type=S.SMOOTH, smooth=S.SmoothConfig(algorithm=S.SmoothConfig.EXPONENTIAL,
                                                                            alpha=0.5))),
        scatter("ma", "loss", stats=S(type=S.SMOOTH, smooth=S.SmoothConfig(algorithm=S.SmoothConfig.MOVING_AVERAGE,
                                                                           window_size=2))),
        scatter("holt", "loss", stats=S(type=S.FORECAST, forecast=S.ForecastConfig(alpha=0.5, beta=0.5,
                                                                                   steps_ahead=2))),
        scatter("clip", "loss", coords=M.CoordSpec(y_min=1.5, y_max=3.5)),
        scatter("late", "loss", mapping=M.MappingSpec(x="time")),
        M.PlotSpec(plot_id="hist", type=M.HISTOGRAM, data=M.DataSpec(metrics=["loss"])),
        M.PlotSpec(plot_id="bar", type=M.BAR, data=M.DataSpec(metrics=["loss"])),
    ]
    plots[4].data.CopyFrom(M.DataSpec(metrics=["loss"], ranges=[M.DataSpec.DataRange(start_step=2)]))
    chart = dash.CreateChart(D.CreateChartRequest(parent=f"experiments/{exp.id}/workUnits/1",
                                                  chart=chart_message(*plots)), metadata=as_alice)
    data = dash.GetChartData(D.GetChartDataRequest(name=chart.name), metadata=as_alice)
    got = {p.plot_id: p for p in data.plots_data}

    def avgs(plot_id: str) -> list[float]:
        return [p.avg_value for p in got[plot_id].scatter_series.points]

    assert avgs("ema") == [4.0, 3.0, 2.0, 2.5]
    assert avgs("ma") == [4.0, 3.0, 1.5, 2.0]
    holt = got["holt"].scatter_series.points
    assert [p.step for p in holt] == [0, 1, 2, 3, 4, 5] and len(avgs("holt")) == 6
    assert avgs("clip") == [3.5, 2.0, 1.5, 3.0]
    late = got["late"].scatter_series.points
    assert [(p.step, p.avg_value) for p in late] == [(2, 1.0), (3, 3.0)]
    assert late[1].timestamp.seconds - late[0].timestamp.seconds == 1
    assert sum(b.value_or_count for b in got["hist"].bar_data.buckets) == 4
    assert got["hist"].bar_data.buckets[0].category_or_bin.startswith("[1, ")
    assert [(b.category_or_bin, b.value_or_count) for b in got["bar"].bar_data.buckets] == [("wid 1", 3.0)]


def test_it_groups_work_units_by_an_arg_in_get_chart_data(dash: Any, persona: Persona) -> None:
    alice, as_alice = persona("alice")
    exp = experiment_for(alice)
    for wid, lr, values in ((1, "0.1", [1.0, 2.0]), (2, "0.1", [3.0, 4.0]), (3, "0.5", [10.0, 20.0])):
        message = factories.work_unit_message()
        message.executable.jobset.jobs[0].spec.args["lr"] = lr
        wu_services.create_work_unit(exp.id, message, work_unit_id=wid)
        write(WorkUnit.objects.get(experiment=exp, wid=wid), "loss", values)
    chart = dash.CreateChart(D.CreateChartRequest(parent=f"experiments/{exp.id}/workUnits/1", chart=chart_message(
        scatter("by_lr", "loss", mapping=M.MappingSpec(group="arg.lr")),
        M.PlotSpec(plot_id="bars", type=M.BAR, data=M.DataSpec(metrics=["loss"]),
                   mapping=M.MappingSpec(group="arg.lr")))), metadata=as_alice)
    data = dash.GetChartData(D.GetChartDataRequest(name=chart.name, parent_experiment=f"experiments/{exp.id}"),
                             metadata=as_alice)
    lines = {p.scatter_series.work_unit_id: [q.avg_value for q in p.scatter_series.points]
             for p in data.plots_data if p.plot_id == "by_lr"}
    assert lines == {"lr=0.1": [2.0, 3.0], "lr=0.5": [10.0, 20.0]}
    (bars,) = [p.bar_data for p in data.plots_data if p.plot_id == "bars"]
    assert [(b.category_or_bin, b.value_or_count) for b in bars.buckets] == [("lr=0.1", 3.0), ("lr=0.5", 20.0)]
