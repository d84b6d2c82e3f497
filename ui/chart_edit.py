"""Making and changing charts on the pages: ``.../workUnits/<wid>/charts/new`` and ``.../charts/<id>/edit``.

Thin views over the DashboardService's own handlers (``xmc.api.registry.invoke`` with the session's
`Identity`): CreateChart / UpdateChart validate the chart (``metrics.specs``) and check access exactly
as over the API (readers of an experiment may chart it; only its writers or the chart's creator
change a chart), and CreateDashboard / UpdateDashboard add it to a dashboard. The form
(``ui.chart_form``) picks metrics, the units (this one or all), a grouping by argument and the geom.
A refused field comes back next to the form with its name (status 400) and nothing is written.
"""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from google.protobuf import field_mask_pb2

from core import pb
from core.errors import InvalidArgument, ServiceError
from metrics import summaries
from ui import chart_form, reads
from ui.views import _ids, signed_in
from xmc.api import registry
from xmc.auth.identity import Identity

D, M = pb.dashboard_api, pb.dashboard


def _invoke(method: str, request: Any, identity: Identity) -> Any:
    return registry.invoke(registry.DASHBOARDS, method, request, registry.Caller(identity))


def _add_to_dashboard(form: chart_form.ChartForm, chart_id: str, identity: Identity) -> str:
    """Put the chart on the dashboard the form names (a new one: its title); its id, or "" for none."""
    if form.dashboard == "new":
        made = _invoke("CreateDashboard", D.CreateDashboardRequest(dashboard=M.Dashboard(
            title=form.dashboard_title or form.title, chart_ids=[chart_id])), identity)
        return str(made.name).removeprefix("dashboards/")
    if form.dashboard:
        name = f"dashboards/{form.dashboard}"
        have = _invoke("GetDashboard", D.GetDashboardRequest(name=name), identity)
        if chart_id not in have.chart_ids:
            _invoke("UpdateDashboard", D.UpdateDashboardRequest(
                dashboard=M.Dashboard(name=name, chart_ids=[*have.chart_ids, chart_id]),
                update_mask=field_mask_pb2.FieldMask(paths=["chart_ids"])), identity)
        return form.dashboard
    return ""


def _page(request: HttpRequest, identity: Identity, x: int, w: int, form: chart_form.ChartForm, *,
          chart_id: str = "", error: str = "", status: int = 200) -> HttpResponse:
    varying, shared = reads.sweep_args(x)
    mine = [d for d in reads.dashboards(identity) if d["mine"]]
    return render(request, "ui/chart_form.html", {
        "xid": x, "wid": w, "form": form, "chart_id": chart_id, "error": error,
        "action": reverse("ui-chart-edit", args=[x, w, chart_id]) if chart_id else reverse("ui-chart-new", args=[x, w]),
        **chart_form.choices(form, summaries.experiment_metrics(x), [*varying, *shared], mine),
    }, status=status)


def _error(exc: ServiceError) -> str:
    return f"{exc.field}: {exc}" if exc.field else str(exc)


def _done(x: int, w: int, dashboard_id: str) -> HttpResponse:
    if dashboard_id:
        return redirect("ui-dashboard", dashboard_id=dashboard_id)
    return redirect(reverse("ui-work-unit", args=[x, w]) + "#metrics")


@signed_in
def new_chart(request: HttpRequest, identity: Identity, xid: str, wid: str) -> HttpResponse:
    """The empty form (GET), or CreateChart under the work unit and, when asked, onto a dashboard (POST)."""
    x, w = _ids(xid, wid)
    reads.work_unit(x, w, identity)  # permission first: a stranger's or a missing unit is the 404 page
    if request.method != "POST":
        return _page(request, identity, x, w, chart_form.ChartForm(units="all"))
    form = chart_form.read_form(request.POST)
    try:
        if form.dashboard == "new" and not (form.dashboard_title or form.title):
            raise InvalidArgument("a new dashboard needs a title", field="dashboard.title")
        chart = _invoke("CreateChart", D.CreateChartRequest(parent=f"experiments/{x}/workUnits/{w}",
                                                           chart=chart_form.chart_from_form(form)), identity)
        dashboard_id = _add_to_dashboard(form, str(chart.name).rsplit("/", 1)[-1], identity)
    except ServiceError as exc:
        return _page(request, identity, x, w, form, error=_error(exc), status=400)
    return _done(x, w, dashboard_id)


@signed_in
def edit_chart(request: HttpRequest, identity: Identity, xid: str, wid: str, chart_id: str) -> HttpResponse:
    """A stored chart in the form (GET), or UpdateChart of its title and plot (POST; its writers only)."""
    x, w = _ids(xid, wid)
    name = f"experiments/{x}/workUnits/{w}/charts/{chart_id}"
    stored = _invoke("GetChart", D.GetChartRequest(name=name), identity)  # unreadable or missing: the 404 page
    if request.method != "POST":
        return _page(request, identity, x, w, chart_form.form_of(stored), chart_id=chart_id)
    form = chart_form.read_form(request.POST)
    chart = chart_form.chart_from_form(form)
    chart.name = name
    try:
        _invoke("UpdateChart", D.UpdateChartRequest(chart=chart, update_mask=field_mask_pb2.FieldMask(
            paths=["title", "plots"])), identity)
        dashboard_id = _add_to_dashboard(form, chart_id, identity)
    except ServiceError as exc:
        return _page(request, identity, x, w, form, chart_id=chart_id, error=_error(exc),
                     status=403 if exc.code == "PERMISSION_DENIED" else 400)
    return _done(x, w, dashboard_id)
