"""What the researcher's pages read: every query of ``ui.views`` is a function here.

Permission first, through the API's own code: the experiment's ACLs are
checked with ``xmc.api.reads`` / ``xmc.api.access`` (a caller who may not
read it gets ``PermissionDenied``, which the views answer as 404, as they do
a missing experiment or work unit), lists use the API's filter fields and
``xmc.listing`` (the same AIP-160 parser, orders and page tokens), and
readable experiments are ``experiments.acl.readable_q``. Rows are returned as
plain dicts and small dataclasses for the templates; nothing here writes.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.db.models import CharField, Count, OuterRef, Q, Subquery, Value
from django.db.models.functions import Cast, Concat, JSONObject
from django.utils import timezone

from artifacts import xprof
from artifacts.models import Artifact
from core import pb
from core.errors import InvalidArgument, NotFound
from experiments import acl
from experiments.acl import Role
from experiments.models import Experiment
from metrics import data as chart_data
from metrics import services as metric_services
from metrics import specs
from metrics.models import Chart
from ui import plotdata
from workunits.choices import ExecutionState, WorkUnitState
from workunits.models import StatusHistory, StatusMessage, WorkUnit, WorkUnitExecution
from xmc import listing
from xmc.api import handlers, reads, registry
from xmc.auth.identity import Identity

#: Work units one experiment page shows at most (the table sorts and filters in the page).
MAX_UNITS = 5_000


def role(identity: Identity, xid: int) -> tuple[Role, dict[str, Any]]:
    """The caller's role on experiment ``xid`` and its row, after the read check (``PermissionDenied``)."""
    row = reads.experiment(xid, identity, Role.READER)
    acls: dict[str, Any] = getattr(row, "acls", None) or {}
    return acl.role_of(identity, acls), _experiment_dict(row)


def readable_xids(identity: Identity, xids: Sequence[int]) -> list[int]:
    """Those of ``xids`` the caller may read (the list page's event stream)."""
    return list(Experiment.objects.filter(acl.readable_q(identity), id__in=list(xids)[:500])
                .values_list("id", flat=True))


def _experiment_dict(row: Any) -> dict[str, Any]:
    return {column: getattr(row, column) for column in reads.ExperimentRow.COLUMNS}


# --- The experiments list ----------------------------------------------------------------------

@dataclass(frozen=True)
class ExperimentQuery:
    """The list page's query string: every filter is here, so a URL can be shared."""

    q: str = ""  # title contains
    state: str = ""  # "active" | "inactive" | "failed" (a unit failed) | "running"
    mine: bool = False
    filter: str = ""  # AIP-160, the API's syntax and fields
    order: str = "create_time desc"
    page: str = ""
    size: int = 50


ORDER_CHOICES = {"create_time desc": "Newest", "create_time": "Oldest", "update_time desc": "Recently updated",
                 "title": "Title"}
STATE_CHOICES = {"": "Any state", "active": "Active", "running": "Running", "failed": "With failures",
                 "inactive": "Finished"}


def experiments_page(identity: Identity, query: ExperimentQuery) -> listing.Page[Any]:
    """One page of the experiments the caller may read, filtered (``InvalidArgument`` on a bad filter)."""
    queryset = Experiment.objects.filter(acl.readable_q(identity)).annotate(
        api_name=Concat(Value("experiments/"), Cast("id", CharField()))
    )
    if query.q:
        queryset = queryset.filter(title__icontains=query.q)
    if query.mine:
        queryset = queryset.filter(creator=identity.email)
    if query.state == "active":
        queryset = queryset.filter(active_state="ACTIVE")
    elif query.state == "inactive":
        queryset = queryset.filter(active_state="INACTIVE")
    elif query.state == "running":
        queryset = queryset.filter(child_state_counts__RUNNING__gt=0)
    elif query.state == "failed":
        queryset = queryset.filter(Q(child_state_counts__FAILED__gt=0) | Q(launch_state="FAILED"))
    try:
        return listing.list_page(
            queryset, fields=handlers.EXPERIMENT_FIELDS, orderable=handlers.EXPERIMENT_ORDER,
            filter=query.filter, order_by=query.order if query.order in ORDER_CHOICES else "",
            page_size=query.size, page_token=query.page,
            fingerprint=f"ui-experiments|{identity.email}|{query.q}|{query.state}|{query.mine}",
            default_order=["create_time desc"],
        )
    except listing.ListingError as exc:
        raise InvalidArgument(str(exc), field="filter") from None


# --- One experiment's work units ---------------------------------------------------------------

_CURRENT = WorkUnitExecution.objects.filter(work_unit=OuterRef("pk"), execution_state=ExecutionState.ACTIVE)
_CURRENT_JSON = Subquery(_CURRENT.values(row=JSONObject(
    eid="eid", state="state", create_time="create_time", update_time="update_time", complete_time="complete_time",
    system_message="system_message", user_message="user_message",
    scheduling_information="scheduling_information"))[:1])


def work_units(xid: int, filter_text: str = "", wids: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The experiment's work units with their current execution, by wid (caller checked the role).

    ``filter_text`` is the API's AIP-160 work unit filter (``state = RUNNING``).
    """
    queryset = handlers.work_units_of(xid).annotate(current=_CURRENT_JSON)
    if filter_text.strip():
        try:
            queryset = queryset.filter(listing.compile_filter(filter_text, handlers.WORK_UNIT_FIELDS))
        except listing.ListingError as exc:
            raise InvalidArgument(str(exc), field="filter") from None
    if wids is not None:
        queryset = queryset.filter(wid__in=list(wids))
    rows = queryset.order_by("wid").values("id", "wid", "executable", "urls", "tags", "notes", "create_time",
                                          "current", "current_eid")[:MAX_UNITS]
    out = []
    for row in rows:
        current = row["current"] or {}
        if isinstance(current, str):  # a jsonb annotation may come back undecoded (no JSONField to decode it)
            current = json.loads(current)
        for key in ("create_time", "update_time", "complete_time"):
            if isinstance(current.get(key), str):
                current[key] = datetime.fromisoformat(current[key])
        row["current"] = current
        out.append(row)
    return out


def artifacts(xid: int, wid: int | None = None) -> list[dict[str, Any]]:
    """The artifacts attached to the experiment (``wid`` None) or to one work unit.

    With each its payload kind and, for a managed xprof one, the xprof URL the
    API would return (`artifacts.xprof.xprof_url`): what its chip opens.
    """
    queryset = Artifact.objects.filter(experiment_id=xid).select_related("work_unit")
    queryset = queryset.filter(work_unit__wid=wid) if wid is not None else queryset.filter(work_unit__isnull=True)
    return [{"id": a.id, "url": a.url, "notes": a.notes, "tags": a.tags, "mime_type": a.mime_type,
             "lifecycle_phase": a.lifecycle_phase, "data_type": a.data_type, "create_time": a.create_time,
             "payload_kind": a.payload_kind, "xprof_url": xprof.xprof_url(a)}
            for a in queryset.order_by("-priority", "id")]


def artifact(xid: int, aid: int) -> Artifact:
    """One artifact of experiment ``xid`` (the caller's read check is done by the view first)."""
    found = Artifact.objects.filter(experiment_id=xid, id=aid).select_related("work_unit").first()
    if found is None:
        raise NotFound(f"artifacts/{aid} not found")
    return found


# --- One work unit -----------------------------------------------------------------------------

@dataclass
class ExecutionView:
    eid: int
    state: str
    execution_state: str
    create_time: datetime
    complete_time: datetime | None
    system_message: Mapping[str, Any] | None
    user_message: Mapping[str, Any] | None
    scheduling_information: Mapping[str, Any] | None
    detailed_status: Mapping[str, Any] | None
    metadata: Mapping[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)


def work_unit(xid: int, wid: int, identity: Identity) -> tuple[dict[str, Any], list[ExecutionView]]:
    """The work unit and every execution (newest first) with its history (``NotFound`` when missing).

    The access check comes first, with the API's order: a caller who may not
    read the experiment learns nothing about the work unit.
    """
    reads.executions(xid, wid, identity)  # permission first; NotFound for a missing work unit
    unit = cast(dict[str, Any], WorkUnit.objects.filter(experiment_id=xid, wid=wid).values(
        "id", "wid", "executable", "urls", "tags", "notes", "create_time", "current_eid", "work_unit_type",
        "priority").get())
    executions = [ExecutionView(history=[], **row) for row in WorkUnitExecution.objects.filter(
        work_unit_id=unit["id"]).order_by("-eid").values(
        "eid", "state", "execution_state", "create_time", "complete_time", "system_message", "user_message",
        "scheduling_information", "detailed_status", "metadata")]
    by_eid = {ex.eid: ex for ex in executions}
    for row in StatusHistory.objects.filter(execution__work_unit_id=unit["id"]).order_by("time", "id").values(
            "execution__eid", "time", "from_state", "to_state", "writer", "extra"):
        item: dict[str, Any] = dict(row)
        by_eid[int(item.pop("execution__eid"))].history.append(item)
    return unit, executions


def messages(xid: int, wid: int, limit: int = 200) -> list[dict[str, Any]]:
    """The work unit's status messages, newest first."""
    rows = StatusMessage.objects.filter(experiment_id=xid, work_unit__wid=wid).order_by("-id").values(
        "id", "execution_id", "content", "severity", "source", "kind", "create_time")[:limit]
    return cast(list[dict[str, Any]], list(rows))


#: Admissions one queue's estimate reads at most (the newest).
ADMISSIONS_READ = 50
#: Where an admitted unit goes from SCHEDULING (RUNNING when the cluster reported both at once).
ADMITTED = (WorkUnitState.STARTING, WorkUnitState.RUNNING)


def recent_admissions(queues: Sequence[str], window_s: float) -> dict[str, list[datetime]]:
    """Per queue name: when its work units were admitted (left SCHEDULING) in the last ``window_s``.

    The newest `ADMISSIONS_READ` per queue, from the status history (the
    partial index ``history_admission_time_idx``). The queue is the LocalQueue
    the work unit names (``schedulingConstraints.queueName``).
    """
    since = timezone.now() - timedelta(seconds=window_s)
    out: dict[str, list[datetime]] = {}
    for queue in sorted({q for q in queues if q}):
        rows = (StatusHistory.objects
                .filter(from_state=WorkUnitState.SCHEDULING, to_state__in=ADMITTED, time__gte=since,
                        execution__work_unit__executable__schedulingConstraints__queueName=queue)
                .order_by("-time").values_list("time", flat=True)[:ADMISSIONS_READ])
        out[queue] = list(rows)
    return out


def now() -> datetime:
    return timezone.now()


# --- Charts and dashboards -----------------------------------------------------------------------

def work_unit_charts(xid: int, wid: int) -> list[dict[str, Any]]:
    """The charts of one work unit (``Chart`` rows), oldest first (caller checked the role)."""
    rows = Chart.objects.filter(experiment_id=xid, work_unit__wid=wid).order_by("create_time", "id").values(
        "chart_id", "title", "description", "plots", "plot_layout")[:MAX_CHARTS]
    return [{**row, "xid": xid, "wid": wid} for row in rows]


def metric_names(xid: int, wid: int) -> list[str]:
    """The metrics the work unit's newest execution has points of (caller checked the role)."""
    return chart_data.metric_names(xid, wid, limit=MAX_CHARTS)


def metric_chart_data(identity: Identity, xid: int, wid: int, metric: str, width: int) -> tuple[Any, Any]:
    """(the default plot of ``metric``, its ``ChartData``) over the work unit's newest execution.

    Permission first, as the page (``xmc.api.reads.work_unit``: a stranger and a
    missing work unit alike raise), then GetChartData's evaluation.
    """
    reads.work_unit(xid, wid, identity)
    if not specs.METRIC_PATTERN.fullmatch(metric):
        raise InvalidArgument("metric must be 1 to 256 printable characters", field="metric")
    plot = plotdata.default_plot(metric)
    return plot, chart_data.chart_data(f"experiments/{xid}/workUnits/{wid}", chart_data.Scope(xid, wid), [plot],
                                       width)


#: Charts one page draws at most (a dashboard holds at most 200).
MAX_CHARTS = 200


def dashboards(identity: Identity) -> list[dict[str, Any]]:
    """The dashboards the caller may read (``metrics.services.readable_dashboards``), recently changed first."""
    rows = (metric_services.readable_dashboards(identity).annotate(chart_count=Count("dashboardchart"))
            .order_by("-update_time", "-id").values("dashboard_id", "title", "description", "owner", "update_time",
                                                     "chart_count")[:500])
    return [{**row, "mine": row["owner"] == identity.email} for row in rows]


@dataclass(frozen=True)
class DashboardView:
    message: Any  # cloud.xmanager.v1.Dashboard, as GetDashboard answers it
    layout: dict[str, Any]  # its chart_layout, proto3 JSON
    charts: list[dict[str, Any]]  # those the caller may read, in the dashboard's order
    hidden: int  # charts of experiments the caller may not read


def dashboard(identity: Identity, dashboard_id: str) -> DashboardView:
    """One dashboard through the API's GetDashboard (its access rule; ``NotFound`` when unreadable)."""
    message = registry.invoke(registry.DASHBOARDS, "GetDashboard",
                              pb.dashboard_api.GetDashboardRequest(name=f"dashboards/{dashboard_id}"),
                              registry.Caller(identity))
    # The dashboard GetDashboard resolved (ids are unique per owner, not globally).
    resolved = metric_services.visible_dashboards_with_id(identity, dashboard_id)[0]
    readable = (Chart.objects.filter(dashboardchart__dashboard=resolved)
                .filter(acl.readable_q(identity, prefix="experiment__")).order_by("dashboardchart__position")
                .values("chart_id", "title", "description", "plots", "plot_layout", "experiment_id", "work_unit__wid",
                        "experiment__title"))[:MAX_CHARTS]
    charts = [{**{k: v for k, v in row.items() if k not in ("experiment_id", "work_unit__wid")},
               "xid": row["experiment_id"], "wid": row["work_unit__wid"]} for row in readable]
    layout = plotdata.message_json(message.chart_layout) if message.HasField("chart_layout") else {}
    return DashboardView(message, layout, charts, max(0, len(message.chart_ids) - len(charts)))
