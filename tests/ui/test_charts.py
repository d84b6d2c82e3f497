"""Charts on the pages through Django's test client: the Metrics section, the data endpoints, dashboards.

Real Postgres and the real services: points through ``metrics.services.write_points``
(the write path's own function), charts and dashboards through ``metrics.services``,
data through the API's GetChartData (the endpoints call its handler).
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.test import Client

from core import pb
from metrics import data as chart_data
from metrics import services, wire
from metrics.models import Dashboard
from tests import factories
from tests.ui import pages
from ui import plotdata
from workunits import services as wu_services
from workunits.models import WorkUnit, WorkUnitExecution

pytestmark = pytest.mark.django_db

ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"
T0 = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
M = pb.dashboard


def _as(name: str) -> Client:
    return pages.signed_in(name)


def _unit(xid: int, wid: int) -> WorkUnit:
    return WorkUnit.objects.get(experiment_id=xid, wid=wid)


def _write(xid: int, wid: int, metric: str, values: list[float], start: int = 0) -> int:
    unit = _unit(xid, wid)
    execution = WorkUnitExecution.objects.get(work_unit=unit, eid=unit.current_eid)
    return services.write_points(execution.pk, [services.Point(metric, start + i, v, T0 + timedelta(seconds=start + i))
                                                for i, v in enumerate(values)])


def _chart(xid: int, wid: int, *plots: Any, title: str = "Training", chart_id: str = "",
           layout: Any = None) -> Any:
    message = M.Chart(title=title, plots=list(plots) or [M.PlotSpec(plot_id="loss", type=M.SCATTER,
                                                                        data=M.DataSpec(metrics=["loss"]))],
                      plot_layout=layout or M.LayoutSpec(type=M.LayoutSpec.GRID, columns=1))
    return services.create_chart(_unit(xid, wid), message, chart_id, creator=ALICE)


def _owned_and_shared(owner: str, reader: str) -> Any:
    return pb.xid.XidAcls(owners=[pb.xid.XidAcls.Role(user=owner)], readers=[pb.xid.XidAcls.Role(user=reader)])


def _get_json(client: Client, url: str) -> tuple[int, Any]:
    response = client.get(url)
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    return response.status_code, json.loads(response.content)


# --- The work unit page's Metrics section ------------------------------------------------------------

def test_it_says_a_unit_has_no_metrics_and_listens_for_its_first_points(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    body = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1").content.decode()
    assert 'id="metrics"' in body and "No metrics yet" in body and "data-chart " not in body
    assert 'hx-trigger="metrics-read"' in body and "metrics=1" in body  # charts.js reads it on the stream's events
    assert "uPlot-1.6.32.iife.min.js" in body and "ui/charts.js" in body


def test_it_gives_a_unit_with_points_but_no_charts_one_default_chart_per_metric(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, "loss", [3.0, 2.0, 1.0])
    _write(exp.id, 1, "val/acc", [0.5, 0.7])
    _write(exp.id, 2, "other-unit-metric", [1.0])
    body = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1").content.decode()
    assert body.count("<figure class=\"card chart\"") == 2
    assert f'data-src="/experiments/{exp.id}/workUnits/1/metrics/data?metric=loss"' in body
    assert "metric=val%2Facc" in body and "other-unit-metric" not in body
    fragment = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1?fragment=metrics").content.decode()
    assert "<section" not in fragment and fragment.count("data-chart ") == 2  # the section's contents
    assert 'id="metrics-have"' in fragment  # with the key of what they show
    # A state change re-renders the page's main part around the drawn charts, which it keeps.
    main = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1?fragment=main").content.decode()
    assert '<section class="metrics" id="metrics" hx-preserve="true"></section>' in main and "data-chart" not in main
    assert 'id="metrics" hx-preserve="true"' in body


def test_it_asks_for_the_section_s_contents_again_only_when_a_metric_or_a_chart_appears(alice_signed_in: Client) -> None:
    """The script redraws the charts the section has; on each "metrics" event the section asks for its
    contents with the key of what it shows, answered 204 (htmx swaps nothing) until a metric that
    starts later, or a chart, gives it something new to show."""
    exp, _ = pages.sweep(ALICE)

    def have(html: str) -> str:
        (key,) = re.findall(r'id="metrics-have" name="have" value="([0-9a-f]+)"', html)
        return key

    def ask(key: str) -> Any:
        return alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1?fragment=metrics&have={key}")

    body = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1").content.decode()
    assert 'hx-include="#metrics-have" hx-trigger="metrics-read" hx-swap="innerHTML"' in body
    empty = have(body)
    assert ask(empty).status_code == 204  # no points yet, still none
    _write(exp.id, 1, "loss", [3.0, 2.0, 1.0])
    first = ask(empty)
    assert first.status_code == 200 and first.content.decode().count("data-chart ") == 1
    key = have(first.content.decode())
    assert key != empty and key == have(alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1").content.decode())
    assert ask(key).status_code == 204 and ask(key).content == b""
    _write(exp.id, 1, "loss", [0.5], start=3)  # more points of the same metric: nothing to swap
    assert ask(key).status_code == 204
    _write(exp.id, 1, "lr", [0.1, 0.05])
    grown = ask(key)
    assert grown.status_code == 200 and grown.content.decode().count("data-chart ") == 2
    later = have(grown.content.decode())
    assert later != key and ask(later).status_code == 204
    assert ask("forged").status_code == 200
    # A chart made for the unit (xdash create-chart) replaces the default ones the same way.
    _chart(exp.id, 1, chart_id="loss-chart")
    charted = ask(later)
    assert charted.status_code == 200 and "charts/loss-chart/data" in charted.content.decode()
    assert ask(have(charted.content.decode())).status_code == 204


def test_it_puts_the_units_charts_before_its_default_ones_and_prints_what_users_wrote_as_text(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, "loss", [3.0, 2.0])
    chart = _chart(exp.id, 1, title=pages.HOSTILE, chart_id="train")
    body = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1").content.decode()
    stored = body.index(f'data-src="/experiments/{exp.id}/workUnits/1/charts/{chart.chart_id}/data"')
    assert stored < body.index(f'data-src="/experiments/{exp.id}/workUnits/1/metrics/data?metric=loss"')
    assert pages.HOSTILE not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body


# --- The data endpoints ---------------------------------------------------------------------------------

def test_it_draws_a_default_chart_from_the_newest_executions_points_by_step(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, "loss", [9.0, 8.0, 7.0])
    wu_services.restart_work_units(exp.id, [1], batch=False)
    _write(exp.id, 1, "loss", [1.0, 0.5])  # the new execution starts its own series
    status, body = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/metrics/data?metric=loss&width=300")
    assert status == 200 and body["points"] == 2 and body["width"] == 300
    (plot,) = body["plots"]
    assert plot["kind"] == "lines" and plot["x"] == "step" and plot["xs"] == [0, 1]
    assert [s["y"] for s in plot["series"]] == [[1.0, 0.5]] and plot["series"][0]["label"] == "loss"


def test_it_answers_the_chart_endpoint_with_get_chart_data_at_the_scripts_width(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, "loss", [float(i % 7) for i in range(3000)])
    chart = _chart(exp.id, 1, M.PlotSpec(plot_id="curve", type=M.SCATTER, data=M.DataSpec(metrics=["loss"])),
                   M.PlotSpec(plot_id="box", type=M.SUMMARY_BOX, data=M.DataSpec(metrics=["loss"])),
                   layout=M.LayoutSpec(type=M.LayoutSpec.GRID, columns=2,
                                       positions=[M.GridPosition(item_id="box", x=1, y=0)]))
    status, body = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/charts/{chart.chart_id}/data?width=120")
    assert status == 200
    curve, box = body["plots"]
    # The same buckets GetChartData answers for that width: at most 120 of them, each with its min and max.
    expected = chart_data.chart_data("x", chart_data.Scope(exp.id, 1), [wire.chart_to_proto(chart).plots[0]], 120)
    assert len(curve["xs"]) == len(expected.plots_data[0].scatter_series.points) <= 120
    assert curve["series"][0]["lo"][0] == 0.0 and curve["series"][0]["hi"][0] == 6.0  # a band per bucket
    assert box["kind"] == "summary" and box["rows"][0]["latest"] == float(2999 % 7) and box["rows"][0]["step"] == 2999
    assert body["layout"] == {"kind": "grid", "columns": 2,
                              "cells": {"box": {"column": 2, "row": 1, "width": 1, "height": 1}}}
    assert body["points"] == len(curve["xs"]) + 1


@pytest.mark.parametrize("width,expected", [("", 600), ("10", plotdata.MIN_WIDTH), ("99999", plotdata.MAX_WIDTH),
                                            ("-5", 600), ("1e9", 600), ("800", 800)])
def test_it_clamps_the_width_to_what_a_screen_shows(alice_signed_in: Client, width: str, expected: int) -> None:
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, "loss", [1.0])
    status, body = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/metrics/data?metric=loss&width={width}")
    assert status == 200 and body["width"] == expected


def test_it_answers_a_bad_metric_name_with_a_400_and_never_a_500(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    for metric in ("", "a\x01b", "x" * 300):
        status, body = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/metrics/data?metric={metric}")
        assert status == 400 and "metric" in body["error"]


def test_it_returns_bars_histograms_and_hostile_names_as_data_not_markup(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, pages.HOSTILE, [1.0, 2.0, 2.0, 3.0])
    chart = _chart(exp.id, 1, M.PlotSpec(plot_id="h", type=M.HISTOGRAM, data=M.DataSpec(metrics=[pages.HOSTILE])),
                   M.PlotSpec(plot_id="b", type=M.BAR, data=M.DataSpec(metrics=[pages.HOSTILE])))
    status, body = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/charts/{chart.chart_id}/data")
    histogram, bars = body["plots"]
    assert histogram["kind"] == "bars" and histogram["histogram"] and sum(histogram["series"][0]["y"]) == 4
    assert histogram["title"] == pages.HOSTILE and histogram["series"][0]["label"] == pages.HOSTILE
    assert bars["categories"] == ["wu 1 · trainer"] and bars["series"][0]["y"] == [3.0]


def test_it_answers_a_stranger_404_for_the_page_the_data_and_a_missing_chart_alike(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, "loss", [1.0])
    chart = _chart(exp.id, 1)
    bob = _as("bob")
    assert bob.get(f"/experiments/{exp.id}/workUnits/1").status_code == 404
    assert bob.get(f"/experiments/{exp.id}/workUnits/1?fragment=metrics").status_code == 404
    stranger = [_get_json(bob, f"/experiments/{exp.id}/workUnits/1/charts/{chart.chart_id}/data"),
                _get_json(bob, f"/experiments/{exp.id}/workUnits/1/charts/missing/data"),
                _get_json(bob, f"/experiments/{exp.id}/workUnits/1/metrics/data?metric=loss"),
                _get_json(bob, f"/experiments/{exp.id}/workUnits/9/metrics/data?metric=loss")]
    assert stranger == [(404, {"error": "not found"})] * 4  # not a byte of difference
    # The owner: a chart of another work unit is not under this one; a missing unit is 404 too.
    assert _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/2/charts/{chart.chart_id}/data")[0] == 404
    assert _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/9/metrics/data?metric=loss")[0] == 404
    assert alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1/charts/{chart.chart_id}/data").status_code == 200


def test_it_lets_a_reader_of_the_experiment_read_its_charts(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE, acls=_owned_and_shared(ALICE, BOB))
    _write(exp.id, 1, "loss", [1.0, 2.0])
    chart = _chart(exp.id, 1)
    bob = _as("bob")
    status, body = _get_json(bob, f"/experiments/{exp.id}/workUnits/1/charts/{chart.chart_id}/data")
    assert status == 200 and body["points"] == 2


def test_it_requires_a_session_for_the_data_endpoints(client: Client) -> None:
    response = client.get("/experiments/1/workUnits/1/metrics/data?metric=loss")
    assert response.status_code == 302 and response["Location"].startswith("/login?next=")


# --- Dashboards ---------------------------------------------------------------------------------------

def _dashboard(owner: str, charts: list[Any], *, dashboard_id: str = "", title: str = "Board",
               layout: Any = None, acls: Any = None) -> Any:
    message = M.Dashboard(title=title, chart_layout=layout or M.LayoutSpec(type=M.LayoutSpec.WRAP))
    dashboard, _ = services.create_dashboard(message, dashboard_id, owner=owner, referenced=charts, inline=[])
    if acls is not None:
        dashboard = services.set_dashboard_acls(dashboard, acls)
    return dashboard


def test_it_lists_only_my_dashboards_and_shared_ones(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    chart = _chart(exp.id, 1)
    _dashboard(ALICE, [chart], dashboard_id="mine", title="my board")
    bobs = factories.experiment(creator=BOB, title="bobs")
    bobs_chart = services.create_chart(factories.work_unit(bobs, wid=1), M.Chart(
        title="b", plots=[M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["m"]))]), "", creator=BOB)
    _dashboard(BOB, [bobs_chart], dashboard_id="shared", title="bob shares",
               acls={"readers": [{"user": ALICE}]})
    _dashboard(BOB, [bobs_chart], dashboard_id="private", title="bob keeps")
    body = alice_signed_in.get("/dashboards").content.decode()
    assert 'href="/dashboards/mine"' in body and 'href="/dashboards/shared"' in body
    assert "bob keeps" not in body and 'href="/dashboards"' in body  # and the navigation links to the list
    assert alice_signed_in.get("/dashboards/private").status_code == 404
    assert alice_signed_in.get("/dashboards/nonexistent").status_code == 404
    assert alice_signed_in.get("/dashboards/no%20such").status_code == 404


def test_it_lays_a_dashboard_s_charts_out_per_its_layout_and_hides_unreadable_ones(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE, acls=_owned_and_shared(ALICE, CAROL))
    first = _chart(exp.id, 1, title="loss", chart_id="loss-1")
    second = _chart(exp.id, 2, title=pages.HOSTILE, chart_id="loss-2")
    other = factories.experiment(creator=ALICE, title="private to alice")
    third = services.create_chart(factories.work_unit(other, wid=1), M.Chart(
        title="private", plots=[M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["m"]))]), "p1",
        creator=ALICE)
    layout = M.LayoutSpec(type=M.LayoutSpec.GRID, columns=3, positions=[
        M.GridPosition(item_id="loss-2", x=0, y=0, width=2, height=1), M.GridPosition(item_id="loss-1", x=2, y=0)])
    _dashboard(ALICE, [first, second, third], dashboard_id="board", title="lr sweep board", layout=layout,
               acls={"readers": [{"user": CAROL}]})
    body = alice_signed_in.get("/dashboards/board").content.decode()
    assert 'class="chart-grid layout-grid" id="dashboard" data-columns="3"' in body
    assert 'id="c-loss-2"' in body and 'data-col="1" data-row="1" data-span="2"' in body
    assert 'data-col="3" data-row="1" data-span="1"' in body and 'id="c-p1"' in body
    assert pages.HOSTILE not in body and f"/experiments/events?x={exp.id}%2C{other.id}&amp;metrics=1" in body
    carol = _as("carol")
    page = carol.get("/dashboards/board").content.decode()
    assert 'id="c-loss-1"' in page and 'id="c-p1"' not in page and "1 chart of experiments you may not read" in page
    assert _get_json(carol, f"/experiments/{other.id}/workUnits/1/charts/p1/data")[0] == 404
    assert _as("bob").get("/dashboards/board").status_code == 404


# --- ui.plotdata ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,kind,columns,cells", [
    ({}, "wrap", 2, {}),
    ({"columns": 3}, "grid", 3, {}),
    ({"type": "STACKED", "columns": 4}, "stacked", 1, {}),
    ({"type": "SIDE_BY_SIDE"}, "side", 3, {}),
    ({"type": "GRID", "columns": 64}, "grid", plotdata.MAX_COLUMNS, {}),
    # Out of the grid, too wide, unknown and repeated items: clamped or dropped, never an error.
    ({"type": "GRID", "columns": 2, "positions": [
        {"itemId": "a", "x": 5, "y": 1, "width": 9, "height": 9}, {"itemId": "charts/b", "x": 1},
        {"itemId": "zzz"}, {"itemId": "a", "x": 0}]}, "grid", 2,
     {"a": plotdata.Cell(1, 2, 2, 4), "b": plotdata.Cell(2, 1, 1, 1)}),
])
def test_it_computes_layouts(spec: dict[str, Any], kind: str, columns: int, cells: dict[str, Any]) -> None:
    layout = plotdata.layout(spec, ["a", "b", "c"])
    assert (layout.kind, layout.columns, dict(layout.cells)) == (kind, columns, cells)


def test_it_gives_series_of_several_units_one_shared_x_with_gaps_as_null() -> None:
    data = M.ChartData()
    for wid, steps in (("1", (0, 1, 2)), ("2", (1, 3))):
        series = M.ChartData.SeriesData(metric_name="loss", work_unit_id=wid)
        for step in steps:
            series.points.add(step=step, avg_value=float(step), min_value=float(step), max_value=float(step))
        data.plots_data.add(plot_id="p", type=M.SCATTER, scatter_series=series)
    spec = M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                      coords=M.CoordSpec(y_scale=M.CoordSpec.LOG),
                      geoms=[M.GeomSpec(type=M.GeomSpec.HLINE, yintercept=0.5)])
    (plot,) = plotdata.chart_json([spec], data)["plots"]
    assert plot["xs"] == [0, 1, 2, 3] and plot["y_scale"] == "log" and plot["hlines"] == [0.5]
    assert [(s["label"], s["y"]) for s in plot["series"]] == [
        ("wu 1", [0.0, 1.0, 2.0, None]), ("wu 2", [None, 1.0, None, 3.0])]  # one metric: the units name them
    assert "lo" not in plot["series"][0] and plot["points"] == 5


@pytest.mark.parametrize(("geoms", "style"), [
    ((), "line"),
    (("LINE",), "line"),
    (("LINE", "HLINE"), "line"),
    (("POINT",), "points"),
    (("POINT", "LINE"), "line"),
    (("AREA",), "area"),
    (("BAR",), "bars"),
    (("BAR", "LINE"), "bars"),
    (("RIBBON",), "ribbon"),
    (("RIBBON", "VLINE"), "ribbon"),
    (("RIBBON", "LINE"), "line"),  # the line with its band: the default look
])
def test_it_draws_a_plot_s_series_as_its_geoms_say(geoms: tuple[str, ...], style: str) -> None:
    M = pb.dashboard
    spec = M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                      geoms=[M.GeomSpec(type=M.GeomSpec.GeomType.Value(g)) for g in geoms])
    data = M.ChartData(plots_data=[M.ChartData.PlotData(plot_id="p", type=M.SCATTER, scatter_series=M.ChartData.SeriesData(
        metric_name="loss", work_unit_id="1", points=[M.ChartData.SeriesPoint(step=1, avg_value=2, min_value=1, max_value=3)]))])
    (plot,) = plotdata.chart_json([spec], data)["plots"]
    assert plot["style"] == style and plot["series"][0]["lo"] == [1] and plot["series"][0]["hi"] == [3]


def test_it_draws_every_unit_of_the_experiment_named_by_wid_and_job_in_a_chart_comparing_units(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)  # three units, lr 0.1 / 0.01 / 0.001, job "trainer"
    for wid, final in ((1, 0.9), (2, 0.2), (3, 0.5)):
        _write(exp.id, wid, "loss", [2.0, final])
    per_unit = M.PlotSpec(plot_id="curves", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                          mapping=M.MappingSpec(color="work_unit"))
    grouped = M.PlotSpec(plot_id="by_lr", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                         mapping=M.MappingSpec(group="arg.lr"))
    bars = M.PlotSpec(plot_id="final", type=M.BAR, data=M.DataSpec(metrics=["loss"]),
                      mapping=M.MappingSpec(color="work_unit"))
    boxes = M.PlotSpec(plot_id="kpi", type=M.SUMMARY_BOX, data=M.DataSpec(metrics=["loss"]),
                       mapping=M.MappingSpec(color="work_unit"))
    chart = _chart(exp.id, 1, per_unit, grouped, bars, boxes, chart_id="sweep-overview")
    status, body = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/charts/{chart.chart_id}/data")
    curves, by_lr, final, kpi = body["plots"]
    assert status == 200 and body["scope"] == "experiment"
    assert [s["label"] for s in curves["series"]] == ["wu 1 · trainer", "wu 2 · trainer", "wu 3 · trainer"]
    assert sorted(s["label"] for s in by_lr["series"]) == ["lr=0.001", "lr=0.01", "lr=0.1"]
    assert final["categories"] == ["wu 1 · trainer", "wu 2 · trainer", "wu 3 · trainer"]
    assert final["series"][0]["y"] == [0.9, 0.2, 0.5]
    assert [(r["unit"], r["metric"], r["latest"]) for r in kpi["rows"]] == [
        ("wu 1 · trainer", "loss", 0.9), ("wu 2 · trainer", "loss", 0.2), ("wu 3 · trainer", "loss", 0.5)]
    assert kpi["units"] is True
    alone = _chart(exp.id, 1, chart_id="just-mine")  # no mapping: the chart's own work unit
    status, mine = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/charts/{alone.chart_id}/data")
    assert mine["scope"] == "work_unit" and [s["label"] for s in mine["plots"][0]["series"]] == ["loss"]


# --- Making and changing charts on the pages ------------------------------------------------------------

def test_it_creates_a_chart_over_all_units_from_the_form_and_puts_it_on_a_new_dashboard(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    for wid in (1, 2, 3):
        _write(exp.id, wid, "loss", [2.0, 1.0 / wid])
    form = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1/charts/new").content.decode()
    assert 'name="metrics" value="loss"' in form and '<option value="lr">lr (mean per value)</option>' in form
    done = alice_signed_in.post(f"/experiments/{exp.id}/workUnits/1/charts/new", {
        "title": "Loss of every unit", "metrics": "loss", "units": "all", "kind": "lines", "geom": "points",
        "dashboard": "new", "dashboard_title": "My sweep"})
    assert done.status_code == 302 and done["Location"].startswith("/dashboards/")
    dashboard = Dashboard.objects.get(title="My sweep", owner=ALICE)
    chart = dashboard.charts.get()
    assert chart.title == "Loss of every unit" and chart.plots[0]["mapping"]["color"] == "work_unit"
    assert chart.plots[0]["geoms"] == [{"type": "POINT"}]
    status, body = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/charts/{chart.chart_id}/data")
    assert [s["label"] for s in body["plots"][0]["series"]] == ["wu 1 · trainer", "wu 2 · trainer", "wu 3 · trainer"]
    page = alice_signed_in.get(done["Location"]).content.decode()
    assert f'charts/{chart.chart_id}/edit">Edit</a>' in page and "/ every work unit</a>" in page


def test_it_draws_every_unit_of_the_sweep_on_the_xdash_preset_dashboard(alice_signed_in: Client) -> None:
    # What `xdash create-dashboard --xids X` sends (xdash.presets.create_standard_experiment_chart): a chart
    # named under work unit 1 (a Chart must name one), two KPI boxes and two curves, no mapping.
    exp, _ = pages.sweep(ALICE)
    for wid in (1, 2, 3):
        _write(exp.id, wid, "val/loss", [2.0, 1.0 / wid])
        _write(exp.id, wid, "train/accuracy", [0.5, 0.5 + wid / 10])
    chart = _chart(exp.id, 1, M.PlotSpec(plot_id="val_loss_kpi", type=M.SUMMARY_BOX, data=M.DataSpec(metrics=["val/loss"])),
                   M.PlotSpec(plot_id="loss_vs_steps", type=M.SCATTER, data=M.DataSpec(metrics=["val/loss"]),
                              mapping=M.MappingSpec(x="step")),
                   chart_id=f"exp_{exp.id}", title=f"Experiment {exp.id} Overview")
    dashboard = _dashboard(ALICE, [chart], title="Sweep")
    page = alice_signed_in.get(f"/dashboards/{dashboard.dashboard_id}").content.decode()
    src = re.search(rf'data-src="(/experiments/{exp.id}/workUnits/1/charts/exp_{exp.id}/data[^"]*)"', page)
    assert src is not None and "over=experiment" in src.group(1) and "/ every work unit</a>" in page
    status, body = _get_json(alice_signed_in, src.group(1).replace("&amp;", "&"))
    assert status == 200 and body["scope"] == "experiment"
    box, curve = body["plots"]
    assert [s["label"] for s in curve["series"]] == ["wu 1 · trainer", "wu 2 · trainer", "wu 3 · trainer"]
    assert [s["y"][-1] for s in curve["series"]] == [1.0, 0.5, 1.0 / 3]
    assert len(box["rows"]) == 3  # the last value of every unit
    # On the work unit's own page the same chart stays that unit's.
    status, own = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/charts/exp_{exp.id}/data")
    assert own["scope"] == "work_unit" and len(own["plots"][1]["series"]) == 1


def test_it_edits_a_chart_grouping_by_an_argument_and_names_a_refused_field(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, "loss", [2.0, 1.0])
    chart = _chart(exp.id, 1, chart_id="mine")
    edit = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1/charts/mine/edit").content.decode()
    assert 'value="Training"' in edit and 'value="loss" checked' in edit
    saved = alice_signed_in.post(f"/experiments/{exp.id}/workUnits/1/charts/mine/edit", {
        "title": "By lr", "metrics": "loss", "units": "all", "group": "lr", "kind": "lines", "geom": "line"})
    assert saved.status_code == 302 and saved["Location"].endswith(f"/workUnits/1#metrics")
    chart.refresh_from_db()
    assert chart.title == "By lr" and chart.plots[0]["mapping"]["group"] == "arg.lr"
    refused = alice_signed_in.post(f"/experiments/{exp.id}/workUnits/1/charts/mine/edit", {"title": "No metrics"})
    assert refused.status_code == 400 and "chart.plots[0].data.metrics" in refused.content.decode()
    chart.refresh_from_db()
    assert chart.title == "By lr"  # nothing written
    reader = pages.signed_in("bob")
    shared, _ = pages.sweep(ALICE, acls=pages.shared_with(BOB))
    _chart(shared.id, 1, chart_id="alices")
    denied = reader.post(f"/experiments/{shared.id}/workUnits/1/charts/alices/edit", {"title": "x", "metrics": "loss"})
    assert denied.status_code == 403
    stranger = pages.signed_in("carol")
    assert stranger.get(f"/experiments/{exp.id}/workUnits/1/charts/new").status_code == 404
    assert stranger.get(f"/experiments/{exp.id}/workUnits/1/charts/mine/edit").status_code == 404


def test_it_gives_system_metrics_a_system_group_of_their_own(alice_signed_in: Client) -> None:
    """The ``system/*`` series XMC records from the cluster (issue 41 item 3): a "System" group, one chart per
    measure and one for every GPU together, not one default chart each among the job's own metrics."""
    exp, _ = pages.sweep(ALICE)
    _write(exp.id, 1, "loss", [3.0, 2.0])
    _write(exp.id, 1, "system/gpu_utilization", [0.9, 0.0])
    for gpu in range(2):
        _write(exp.id, 1, f"system/gpu_utilization/trainer-0-0/gpu{gpu}", [0.9, 0.0])
    _write(exp.id, 1, "system/cpu_usage_cores", [2.0, 2.1])
    body = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1").content.decode()
    assert '<h2>System</h2>' in body and body.index("<h2>System</h2>") < body.index("metric=loss")
    system = body[body.index("<h2>System</h2>"):body.index('id="m-0"')]
    assert system.count('data-chart ') == 3 and "GPU utilisation per GPU" in system and "CPU (cores)" in system
    assert body.count("data-chart ") == 4  # the job's own loss, beside the System group
    (per_gpu,) = re.findall(r'data-src="([^"]*title=GPU\+utilisation\+per\+GPU[^"]*)"', system)
    status, data = _get_json(alice_signed_in, per_gpu.replace("&amp;", "&"))
    assert status == 200 and data["plots"][0]["title"] == "GPU utilisation per GPU"
    assert sorted(s["label"].split(" · ")[0] for s in data["plots"][0]["series"]) == [
        "system/gpu_utilization/trainer-0-0/gpu0", "system/gpu_utilization/trainer-0-0/gpu1"]
    status, _ = _get_json(alice_signed_in, f"/experiments/{exp.id}/workUnits/1/metrics/data?" + "&".join(["metric=x"] * 65))
    assert status == 400  # at most 64 overlaid


def test_it_keeps_each_chart_to_its_unit_on_a_dashboard_of_several_charts_of_one_experiment(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    for wid in (1, 2):
        _write(exp.id, wid, "loss", [2.0, 1.0 / wid])
    mine = [_chart(exp.id, wid, chart_id=f"loss-{wid}") for wid in (1, 2)]
    dashboard = _dashboard(ALICE, mine, title="Per unit")
    page = alice_signed_in.get(f"/dashboards/{dashboard.dashboard_id}").content.decode()
    for wid in (1, 2):
        src = re.search(rf'data-src="(/experiments/{exp.id}/workUnits/{wid}/charts/loss-{wid}/data[^"]*)"', page)
        assert src is not None and "over=experiment" not in src.group(1)
    assert "/ every work unit" not in page and f"/ wu 2" in page
