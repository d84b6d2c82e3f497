"""One handler per RPC of ``cloud.xmanager.v1.DashboardService`` (11 RPCs), shared by gRPC and REST.

Registered into `xmc.api.registry.RPCS` like the State Service's handlers
(``xmc.api.handlers``; both are imported by ``XmcConfig.ready()``). Each
parses names, checks access, calls `metrics.services` and converts with
`metrics.wire`; GetChartData evaluates through `metrics.data`.

Names: a chart is ``experiments/{xid}/workUnits/{wid}/charts/{chart_id}``
(what CreateChart answers; chart ids are unique per work unit);
``charts/{chart_id}`` and ``dashboards/{dashboard_id}/charts/{chart_id}``
name the one chart of that id the caller may read (of that dashboard). A
dashboard is ``dashboards/{dashboard_id}``; ids are unique per owner, and the
name means the caller's own dashboard of that id, else the one of that id
shared with them (`metrics.services.visible_dashboards_with_id`). So no one
can take an id ahead of its owner, nor learn by creating one that another's
exists.

Access, permission first (`xmc.api.access`): a chart follows its
experiment's ACLs -- readers read it, get its data and may create charts
(views change nothing of the experiment); its creator (still a reader) and
the experiment's writers update and delete it; under a full name a caller
who may not read the experiment gets the same PERMISSION_DENIED whether or
not it exists. A dashboard follows `metrics.services.dashboard_role`. A short
chart name or a dashboard name the caller may not read is NOT_FOUND, as a
missing one is.
"""
from __future__ import annotations

import re
from typing import Any

from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import CharField, OuterRef, Value
from django.db.models.functions import Cast, Concat
from google.protobuf import empty_pb2

from core import limits, names
from core.pb import dashboard as M
from core.pb import dashboard_api as D
from core.errors import InvalidArgument, NotFound, PermissionDenied
from experiments import acl
from experiments.acl import Role
from metrics import data as chart_data
from metrics import services
from metrics.models import Chart, Dashboard, DashboardChart
from metrics.wire import chart_to_proto, dashboard_to_proto
from workunits.models import WorkUnit
from xmc.api import access
from xmc.api.handlers import _experiment, _experiment_acls, _mask, _page, parse_experiment, parse_work_unit
from xmc.api.registry import DASHBOARDS, Caller, rpc
from xmc.listing import FilterField

_ID = names.ID
_SLUG = names.SLUG
_CHART_UNDER_WU = re.compile(rf"experiments/{_ID}/workUnits/{_ID}/charts/{_SLUG}")
_CHART = re.compile(rf"charts/{_SLUG}")
_CHART_UNDER_DASHBOARD = re.compile(rf"dashboards/{_SLUG}/charts/{_SLUG}")
_DASHBOARD = re.compile(rf"dashboards/{_SLUG}")
_CHART_SHAPES = ("experiments/{xid}/workUnits/{wid}/charts/{chart_id}", "charts/{chart_id}",
                 "dashboards/{dashboard_id}/charts/{chart_id}")


def _bad_name(field: str, value: str, shapes: tuple[str, ...]) -> InvalidArgument:
    return InvalidArgument(f"{field} must look like {' or '.join(repr(s) for s in shapes)} (got {value[:200]!r})",
                           field=field)


def parse_chart(name: str, field: str = "name") -> tuple[str, tuple[int, int] | None, str | None]:
    """(chart_id, (xid, wid) when the name carries them, dashboard_id when it names one)."""
    match = _CHART_UNDER_WU.fullmatch(name or "")
    if match:
        xid, wid = parse_work_unit(name.rsplit("/charts/", 1)[0], field)
        return match.group(3), (xid, wid), None
    match = _CHART.fullmatch(name or "")
    if match:
        return match.group(1), None, None
    match = _CHART_UNDER_DASHBOARD.fullmatch(name or "")
    if match:
        return match.group(2), None, match.group(1)
    raise _bad_name(field, name, _CHART_SHAPES)


def parse_dashboard(name: str, field: str = "name") -> str:
    match = _DASHBOARD.fullmatch(name or "")
    if match is None:
        raise _bad_name(field, name, ("dashboards/{dashboard_id}",))
    return match.group(1)


# --- Access ----------------------------------------------------------------------------------


def _one(found: list[Any], name: str, field: str, hint: str) -> Any:
    """The single resource a short name resolved to: NOT_FOUND for none, INVALID_ARGUMENT when several match."""
    if not found:
        raise NotFound(f"{name} not found", field=field)
    if len(found) > 1:
        raise InvalidArgument(f"{name} names more than one resource you may read; {hint}", field=field)
    return found[0]


def _chart(name: str, caller: Caller, needed: Role, field: str = "name") -> Chart:
    """The chart ``name`` names, if the caller holds ``needed`` (writers, or its creator, for changes).

    Chart ids are unique per work unit. The full name is checked experiment first, as every
    ``experiments/...`` name is (`xmc.api.access`); the short names resolve among the charts the
    caller may read, so one they may not read is NOT_FOUND, the answer a missing one gets.
    """
    chart_id, under, dashboard_id = parse_chart(name, field)
    hint = "use its full name, experiments/{xid}/workUnits/{wid}/charts/{chart_id}"
    if under is not None:
        found = services.find_chart(under[0], under[1], chart_id)
        if found is None:
            raise access.missing_child(caller.identity, _experiment_acls(under[0]), Role.READER,
                                       resource=name, field=field)
        chart: Chart = found
    elif dashboard_id is not None:
        dashboard = _dashboard(f"dashboards/{dashboard_id}", caller, Role.READER, field)
        chart = _one(services.readable_charts_with_id(caller.identity, chart_id, dashboard=dashboard), name, field,
                     hint)
    else:
        chart = _one(services.readable_charts_with_id(caller.identity, chart_id), name, field, hint)
    acls = chart.experiment.acls
    if needed > Role.READER and chart.creator == caller.email and acl.role_of(caller.identity, acls) >= Role.READER:
        needed = Role.READER  # its creator may change it while they may read the experiment
    access.require(caller.identity, acls, needed, resource=name, field=field)
    return chart


def _work_unit(xid: int, wid: int, caller: Caller, field: str) -> WorkUnit:
    work_unit = WorkUnit.objects.select_related("experiment").filter(experiment_id=xid, wid=wid).first()
    name = f"experiments/{xid}/workUnits/{wid}"
    if work_unit is None:
        raise access.missing_child(caller.identity, _experiment_acls(xid), Role.READER, resource=name, field=field)
    access.require(caller.identity, work_unit.experiment.acls, Role.READER, resource=name, field=field)
    return work_unit


def _dashboard(name: str, caller: Caller, needed: Role, field: str = "name") -> Dashboard:
    """The dashboard ``name`` means to the caller (their own of that id, else the one of that id they
    may read: `metrics.services.visible_dashboards_with_id`); NOT_FOUND when there is none they may read."""
    dashboard_id = parse_dashboard(name, field)
    dashboard: Dashboard = _one(services.visible_dashboards_with_id(caller.identity, dashboard_id), name, field,
                                "ask an owner to share it under an id of its own")
    chart_acls = list(DashboardChart.objects.filter(dashboard=dashboard).values_list("chart__experiment__acls",
                                                                                    flat=True))
    role = services.dashboard_role(caller.identity, dashboard, chart_acls)
    if role < Role.READER:  # (not reached: only readable ones resolve)
        raise NotFound(f"{name} not found", field=field)
    if role < needed:
        raise PermissionDenied(f"{caller.email} may read but not change {name}", field=field)
    return dashboard


def _referenced_charts(chart_ids: Any, caller: Caller, field: str) -> list[Chart]:
    """The charts a dashboard references, each by its id (unique among the charts the caller may read)
    or its full name; each must exist and be readable by the caller."""
    charts = []
    for i, chart_id in enumerate(chart_ids):
        where = f"{field}[{i}]"
        if _CHART_UNDER_WU.fullmatch(chart_id):
            xid, wid = parse_work_unit(chart_id.rsplit("/charts/", 1)[0], where)
            found = services.find_chart(xid, wid, chart_id.rsplit("/", 1)[1])
            matches = [found] if found is not None and (caller.identity.is_staff or acl.role_of(
                caller.identity, found.experiment.acls) >= Role.READER) else []
        else:
            matches = services.readable_charts_with_id(caller.identity, chart_id)
        if not matches:
            # One message for "missing" and "not yours": names cannot be probed.
            raise InvalidArgument(f"{where}: chart {chart_id!r} does not exist or {caller.email} may not read it",
                                  field=where)
        if len(matches) > 1:
            raise InvalidArgument(f"{where}: several charts you may read are called {chart_id!r}; give its full "
                                  "name, experiments/{xid}/workUnits/{wid}/charts/{chart_id}", field=where)
        charts.append(matches[0])
    return charts


def _dashboard_proto(dashboard: Dashboard) -> M.Dashboard:
    return dashboard_to_proto(dashboard, services.chart_ids_of(dashboard))


# --- Dashboards ------------------------------------------------------------------------------

DASHBOARD_FIELDS = {
    "name": FilterField("api_name", "string"),
    "title": FilterField("title", "string"),
    "description": FilterField("description", "string"),
    "owner": FilterField("owner", "string"),
    "create_time": FilterField("create_time", "timestamp"),
    "update_time": FilterField("update_time", "timestamp"),
    # The filter xm_cloud.list_dashboards sends: dashboards with a chart of experiment X.
    "charts.experiment_id": FilterField("chart_xids", "string_list"),
    "chart_ids": FilterField("chart_id_list", "string_list"),
}
DASHBOARD_ORDER = {"create_time": "create_time", "update_time": "update_time", "title": "title", "name": "id"}


@rpc(DASHBOARDS, "CreateDashboard", D.CreateDashboardRequest, M.Dashboard)
def create_dashboard(request: D.CreateDashboardRequest, caller: Caller) -> M.Dashboard:
    referenced = _referenced_charts(request.dashboard.chart_ids, caller, "dashboard.chart_ids")
    limits_count = len(request.charts)
    if limits_count > 50:
        raise InvalidArgument(f"charts has {limits_count} entries; at most 50 are allowed", field="charts")
    inline = []
    for i, chart in enumerate(request.charts):
        field = f"charts[{i}]"
        if chart.xid <= 0 or chart.wid <= 0:
            raise InvalidArgument(f"{field}: xid and wid must name the chart's work unit (positive)",
                                  field=f"{field}.xid" if chart.xid <= 0 else f"{field}.wid")
        if chart.xid > limits.MAX_ID or chart.wid > limits.MAX_ID:
            raise InvalidArgument(f"{field}: an id is larger than {limits.MAX_ID}", field=f"{field}.xid")
        inline.append(services.InlineChart(_work_unit(chart.xid, chart.wid, caller, field), chart, field))
    dashboard, chart_ids = services.create_dashboard(request.dashboard, request.dashboard_id, owner=caller.email,
                                                     referenced=referenced, inline=inline)
    return dashboard_to_proto(dashboard, chart_ids)


@rpc(DASHBOARDS, "GetDashboard", D.GetDashboardRequest, M.Dashboard)
def get_dashboard(request: D.GetDashboardRequest, caller: Caller) -> M.Dashboard:
    return _dashboard_proto(_dashboard(request.name, caller, Role.READER))


@rpc(DASHBOARDS, "ListDashboards", D.ListDashboardsRequest, D.ListDashboardsResponse)
def list_dashboards(request: D.ListDashboardsRequest, caller: Caller) -> D.ListDashboardsResponse:
    links = DashboardChart.objects.filter(dashboard=OuterRef("pk"))
    queryset = services.readable_dashboards(caller.identity).annotate(
        api_name=Concat(Value("dashboards/"), "dashboard_id", output_field=CharField()),
        chart_xids=ArraySubquery(links.values(xid=Cast("chart__experiment_id", CharField()))),
        chart_id_list=ArraySubquery(links.order_by("position").values("chart__chart_id")),
    )
    page = _page(queryset, request, fields=DASHBOARD_FIELDS, orderable=DASHBOARD_ORDER,
                 fingerprint=f"dashboards|{caller.email}", default_order=["create_time desc"])
    return D.ListDashboardsResponse(
        dashboards=[dashboard_to_proto(d, d.chart_id_list) for d in page.items], next_page_token=page.next_page_token)


@rpc(DASHBOARDS, "UpdateDashboard", D.UpdateDashboardRequest, M.Dashboard)
def update_dashboard(request: D.UpdateDashboardRequest, caller: Caller) -> M.Dashboard:
    dashboard = _dashboard(request.dashboard.name, caller, Role.WRITER, "dashboard.name")
    paths = _mask(request.update_mask.paths)
    referenced = (_referenced_charts(request.dashboard.chart_ids, caller, "dashboard.chart_ids")
                  if "chart_ids" in paths else None)
    return _dashboard_proto(services.update_dashboard(dashboard, request.dashboard, paths, referenced))


@rpc(DASHBOARDS, "DeleteDashboard", D.DeleteDashboardRequest, empty_pb2.Empty)
def delete_dashboard(request: D.DeleteDashboardRequest, caller: Caller) -> empty_pb2.Empty:
    services.delete_dashboard(_dashboard(request.name, caller, Role.OWNER))
    return empty_pb2.Empty()


# --- Charts ---------------------------------------------------------------------------------


@rpc(DASHBOARDS, "CreateChart", D.CreateChartRequest, M.Chart)
def create_chart(request: D.CreateChartRequest, caller: Caller) -> M.Chart:
    xid, wid = parse_work_unit(request.parent, "parent")
    for name, value, expected in (("xid", request.chart.xid, xid), ("wid", request.chart.wid, wid)):
        if value and value != expected:
            raise InvalidArgument(f"chart.{name} ({value}) is not the parent's ({expected})", field=f"chart.{name}")
    work_unit = _work_unit(xid, wid, caller, "parent")
    return chart_to_proto(services.create_chart(work_unit, request.chart, request.chart_id, creator=caller.email))


@rpc(DASHBOARDS, "GetChart", D.GetChartRequest, M.Chart)
def get_chart(request: D.GetChartRequest, caller: Caller) -> M.Chart:
    return chart_to_proto(_chart(request.name, caller, Role.READER))


CHART_FIELDS = {
    "name": FilterField("api_name", "string"),
    "title": FilterField("title", "string"),
    "creator": FilterField("creator", "string"),
    "create_time": FilterField("create_time", "timestamp"),
    "update_time": FilterField("update_time", "timestamp"),
}


@rpc(DASHBOARDS, "ListCharts", D.ListChartsRequest, D.ListChartsResponse)
def list_charts(request: D.ListChartsRequest, caller: Caller) -> D.ListChartsResponse:
    """Charts of a work unit, or of a dashboard (those of them the caller may read, in its order)."""
    queryset = Chart.objects.select_related("work_unit", "experiment").annotate(
        api_name=Concat(Value("charts/"), "chart_id", output_field=CharField()))
    if request.parent.startswith("dashboards/"):
        dashboard = _dashboard(request.parent, caller, Role.READER, "parent")
        queryset = queryset.filter(dashboardchart__dashboard=dashboard).filter(
            acl.readable_q(caller.identity, prefix="experiment__"))
        order = {"position": "dashboardchart__position"}
        default = ["position"]
    else:
        xid, wid = parse_work_unit(request.parent, "parent")
        _experiment(xid, caller, Role.READER, field="parent")
        queryset = queryset.filter(experiment_id=xid, work_unit__wid=wid)
        order = {"create_time": "create_time"}
        default = ["create_time"]
    page = _page(queryset, _ListCharts(request), fields=CHART_FIELDS, orderable=order,
                 fingerprint=f"charts|{request.parent}|{caller.email}", default_order=default)
    return D.ListChartsResponse(charts=[chart_to_proto(c) for c in page.items], next_page_token=page.next_page_token)


class _ListCharts:
    """ListChartsRequest has no filter or order_by: the listing reads empty ones."""

    filter = ""

    def __init__(self, request: D.ListChartsRequest) -> None:
        self.page_size = request.page_size
        self.page_token = request.page_token


@rpc(DASHBOARDS, "UpdateChart", D.UpdateChartRequest, M.Chart)
def update_chart(request: D.UpdateChartRequest, caller: Caller) -> M.Chart:
    chart = _chart(request.chart.name, caller, Role.WRITER, "chart.name")
    return chart_to_proto(services.update_chart(chart, request.chart, _mask(request.update_mask.paths)))


@rpc(DASHBOARDS, "DeleteChart", D.DeleteChartRequest, empty_pb2.Empty)
def delete_chart(request: D.DeleteChartRequest, caller: Caller) -> empty_pb2.Empty:
    services.delete_chart(_chart(request.name, caller, Role.WRITER))
    return empty_pb2.Empty()


@rpc(DASHBOARDS, "GetChartData", D.GetChartDataRequest, M.ChartData)
def get_chart_data(request: D.GetChartDataRequest, caller: Caller) -> M.ChartData:
    """The chart's plots evaluated over its work unit, or over ``parent_workunit`` / ``parent_experiment``."""
    chart = _chart(request.name, caller, Role.READER)
    width = request.chart_width_pixels or chart_data.DEFAULT_WIDTH
    if not 1 <= width <= chart_data.MAX_WIDTH:
        raise InvalidArgument(f"chart_width_pixels must be between 1 and {chart_data.MAX_WIDTH} (got {width})",
                              field="chart_width_pixels")
    scope = chart_data.Scope(chart.experiment_id, chart.work_unit.wid)
    if request.parent_workunit:
        xid, wid = parse_work_unit(request.parent_workunit, "parent_workunit")
        _experiment(xid, caller, Role.READER, field="parent_workunit")
        scope = chart_data.Scope(xid, wid)
    elif request.parent_experiment:
        xid = parse_experiment(request.parent_experiment, "parent_experiment")
        _experiment(xid, caller, Role.READER, field="parent_experiment")
        scope = chart_data.Scope(xid, None)
    plots = chart_to_proto(chart).plots
    return chart_data.chart_data(request.name, scope, plots, width)
