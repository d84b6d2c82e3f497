"""The wheel's dashboard clients against a live XMC: the ``xdash`` CLI, ``xdash.DashboardClient``, ``xm_cloud``.

``xdash`` sends ``XMC_AUTH_TOKEN`` as a bearer token and works end to end;
the wheel's ``xm_cloud.create_dashboard`` / ``get_dashboard`` /
``list_dashboards`` open a bare channel with no credentials at all, so they
get UNAUTHENTICATED with a message that says what to use instead (never an
anonymous write). Experiments and points are made server-side; the clients
run unmodified in the client virtualenv.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from metrics import services
from metrics.models import Chart, Dashboard
from tests import factories
from tests.metrics.conftest import experiment_for
from tests.system.real_client.conftest import ALICE, Client
from workunits.models import WorkUnitExecution
from xmc.auth.grpc import DASHBOARD_NO_TOKEN

pytestmark = pytest.mark.django_db(transaction=True)

BOB = "bob@example.com"  # reads Alice's experiment
EVE = "eve@example.com"  # a stranger


def _xdash(client: Client, *args: str) -> tuple[int, str, str]:
    run = client.run([str(client.venv / "bin" / "xdash"), *args], timeout=60,
                     XMC_DASHBOARD_ENDPOINT=client.grpc_target)
    return run.returncode, run.stdout, run.stderr


def _points(xid: int, wid: int, metric: str, values: list[float]) -> None:
    execution = WorkUnitExecution.objects.get(work_unit__experiment_id=xid, work_unit__wid=wid, eid=1)
    now = timezone.now()
    services.write_points(execution.pk, [services.Point(metric, i, v, now + timedelta(seconds=i))
                                         for i, v in enumerate(values)])


def test_it_creates_reads_and_lists_dashboards_and_charts_with_the_xdash_cli(make_client: Callable[..., Client]) -> None:
    exp = experiment_for(ALICE, readers=(BOB,))
    factories.work_unit(exp, wid=1)
    _points(exp.id, 1, "val/loss", [1.0, 0.5, 0.25])
    alice, bob, eve = make_client(ALICE), make_client(BOB), make_client(EVE)

    code, out, err = _xdash(alice, "create-dashboard", "--title", "Sweep", "--dashboard-id", f"sweep{exp.id}",
                            "--xids", str(exp.id))
    assert code == 0, err
    assert out.strip() == f"Created dashboard: dashboards/sweep{exp.id} (title: Sweep)"
    dashboard = Dashboard.objects.get(dashboard_id=f"sweep{exp.id}")
    assert dashboard.owner == ALICE
    assert [c.chart_id for c in dashboard.charts.all()] == [f"exp_{exp.id}"]

    code, out, err = _xdash(alice, "create-chart", "--parent", f"experiments/{exp.id}/workUnits/1",
                            "--title", "Loss", "--metrics", "val/loss,train/accuracy")
    assert code == 0, err
    chart = Chart.objects.exclude(chart_id=f"exp_{exp.id}").get(experiment=exp)
    assert out.strip() == f"Created chart: {chart.name} (title: Loss)"
    assert [p["plotId"] for p in chart.plots] == ["kpi_0", "scatter_0", "kpi_1", "scatter_1"]

    code, out, err = _xdash(bob, "get", f"dashboards/sweep{exp.id}")
    assert code == 0, err
    assert "Title:       Sweep" in out and "Charts:      1" in out
    code, out, err = _xdash(bob, "get", chart.name)
    assert code == 0, err
    assert f"Experiment:  {exp.id} (wid: 1)" in out and "Plots:       4" in out

    code, out, err = _xdash(bob, "get-data", chart.name)
    assert code == 0, err
    assert "Total plots data returned: 2" in out  # no points of train/accuracy yet
    assert "Plot [kpi_0]: Summary value = 0.2500" in out
    assert "Plot [scatter_0]: Scatter series = 3 points" in out

    code, out, err = _xdash(bob, "list")
    assert code == 0, err
    assert f"[dashboards/sweep{exp.id}] Sweep" in out

    # A stranger can read none of it; a dashboard she may not read is "not found", as a missing one
    # (tests/security/test_chart_ids.py).
    code, out, err = _xdash(eve, "get", f"dashboards/sweep{exp.id}")
    assert code == 1 and "PERMISSION_DENIED" not in out and "not found" in err
    code, _, err = _xdash(eve, "get-data", chart.name)
    assert code == 1 and "may not read" in err
    code, out, _ = _xdash(eve, "list")
    assert out.strip() == "Found 0 dashboards:"


def test_it_round_trips_charts_and_data_with_the_dashboard_client_class(make_client: Callable[..., Client]) -> None:
    exp = experiment_for(ALICE)
    factories.work_unit(exp, wid=1)
    _points(exp.id, 1, "loss", [4.0, 2.0, 1.0])
    run = make_client(ALICE).python(
        """
        import os
        from xdash import DashboardClient
        from xdash.builders import ChartBuilder, DashboardBuilder, chart_id_from_name, scatter_plot, summary_kpi_plot

        xid = int(os.environ["XID"])
        with DashboardClient(endpoint=os.environ["XMC_DASHBOARD_ENDPOINT"]) as client:
            chart = (ChartBuilder().for_experiment(xid=xid, wid=1).set_title("Loss")
                     .add_plot(summary_kpi_plot("kpi", "Loss", ["loss"]))
                     .add_plot(scatter_plot("curve", "Loss", ["loss"])).build())
            (created,) = client.create_charts([chart])
            dashboard = DashboardBuilder(name="dashboards/d" + str(xid)).set_title("Mine")
            dashboard.add_chart_id(chart_id_from_name(created.name))
            made = client.create_dashboard(dashboard.build())
            data = client.get_chart_data(created.name)
            report({
                "chart": created.name, "dashboard": made.name, "chart_ids": list(made.chart_ids),
                "got": client.get_dashboard(made.name).title, "listed": [d.name for d in client.list_dashboards()],
                "kpi": data.plots_data[0].summary_data.latest_value,
                "curve": [p.avg_value for p in data.plots_data[1].scatter_series.points],
            })
        """,
        XID=str(exp.id), XMC_DASHBOARD_ENDPOINT=make_client(ALICE).grpc_target,
    ).ok()
    result = run.result
    chart = Chart.objects.get(experiment=exp)
    assert result["chart"] == chart.name and result["chart_ids"] == [chart.chart_id]
    assert (result["dashboard"], result["got"]) == (f"dashboards/d{exp.id}", "Mine")
    assert f"dashboards/d{exp.id}" in result["listed"]
    assert (result["kpi"], result["curve"]) == (1.0, [4.0, 2.0, 1.0])


def test_it_tells_xm_cloud_dashboards_that_send_no_credentials_what_to_use(
        make_client: Callable[..., Client]) -> None:
    exp = experiment_for(ALICE)
    factories.work_unit(exp, wid=1)
    run = make_client(ALICE).python(
        """
        import os
        import grpc
        from xmanager import xm_cloud

        xid = int(os.environ["XID"])
        plot = xm_cloud.create_plot("Main metric")
        chart = xm_cloud.create_chart("Chart", xid, [plot])
        outcome = {"plot_id": plot.to_proto().plot_id, "chart_xid": chart.experiment_id}
        for name, call in (("create", lambda: xm_cloud.create_dashboard("Mine", [chart])),
                           ("get", lambda: xm_cloud.get_dashboard("dashboards/x")),
                           ("list", lambda: xm_cloud.list_dashboards(filter_query=f"charts.experiment_id={xid}"))):
            try:
                call()
                outcome[name] = "OK"
            except grpc.RpcError as exc:
                outcome[name] = [exc.code().name, exc.details()]
        report(outcome)
        """,
        XID=str(exp.id), XMANAGER_DASHBOARD_ENDPOINT=make_client(ALICE).grpc_target,
    ).ok()
    result = run.result
    assert (result["plot_id"], result["chart_xid"]) == ("main_metric", exp.id)
    for name in ("create", "get", "list"):
        assert result[name] == ["UNAUTHENTICATED", DASHBOARD_NO_TOKEN]
    assert not Dashboard.objects.exists() and not Chart.objects.exists()
