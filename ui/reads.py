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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

from django.db.models import (CharField, Count, Max, Min, DurationField, ExpressionWrapper, F, OuterRef, Q,
                              QuerySet, Subquery, Value)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Coalesce, Concat, JSONObject, Now
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
from metrics import summaries
from metrics.models import Chart, MetricSummary
from ui import plotdata
from workunits import arguments
from workunits.choices import ExecutionState, WorkUnitState
from workunits.models import StatusHistory, StatusMessage, WorkUnit, WorkUnitExecution
from xmc import listing
from xmc.api import handlers, reads, registry, sweep_columns
from xmc.auth.identity import Identity
from workunits.eta import ADMISSIONS_READ as ADMISSIONS_READ
from workunits.eta import ADMITTED as ADMITTED
from workunits.eta import recent_admissions as recent_admissions

#: Work units one bulk action (stop / restart) confirms at once.
MAX_ACTION_UNITS = 1_000


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


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    current = row["current"] or {}
    if isinstance(current, str):  # a jsonb annotation may come back undecoded (no JSONField to decode it)
        current = json.loads(current)
    for key in ("create_time", "update_time", "complete_time"):
        if isinstance(current.get(key), str):
            current[key] = datetime.fromisoformat(current[key])
    row["current"] = current
    return row


_ROW = ("id", "wid", "executable", "urls", "tags", "notes", "create_time", "current", "current_eid")


def work_units(xid: int, wids: Sequence[int]) -> list[dict[str, Any]]:
    """The work units ``wids`` of experiment ``xid`` with their current execution, by wid (caller checked the role)."""
    queryset = handlers.work_units_of(xid).annotate(current=_CURRENT_JSON).filter(wid__in=list(wids))
    return [_decoded(row) for row in queryset.order_by("wid").values(*_ROW)]


# --- The experiment page's table: filtered, sorted and paged in the database ------------------

@dataclass(frozen=True)
class UnitQuery:
    """The work unit table's query string (every part of it is in the URL, so a view can be shared)."""

    filter: str = ""  # the API's AIP-160 work unit filter
    sort: str = "wid"  # a key of UNIT_SORTS, or "arg:<name>"
    desc: bool = False
    page: int = 1  # from 1
    size: int = 100
    metrics: tuple[str, ...] = ()  # the metric columns
    goals: tuple[tuple[str, str], ...] = ()  # (metric, "min" | "max"): which value of a column is best


#: Rows one page of the table shows (the ``size`` choices).
UNIT_PAGE_SIZES = (50, 100, 500)
#: How long the current execution has run: to its end, or now (`WorkUnit.current_start` / ``current_end``,
#: indexed together: a sort by it reads the index alone).
_DURATION = ExpressionWrapper(Coalesce("current_end", Now()) - F("current_start"), output_field=DurationField())
#: The table's columns the database sorts by, besides ``arg:<name>``: name -> expression. Each reads the
#: work unit's own row (its current execution's state and times are copied there).
UNIT_SORTS: dict[str, Any] = {
    "wid": F("wid"), "state": F("current_state"), "exec": F("current_eid"), "started": F("current_start"),
    "duration": _DURATION, "job": RawSQL(
        f'COALESCE(NULLIF("{WorkUnit._meta.db_table}"."executable" #>> %s, \'\'), '
        f'"{WorkUnit._meta.db_table}"."executable" #>> %s)',
        (["jobset", "jobs", "0", "groupName"], ["jobset", "jobs", "0", "name"])),
}


def _columns(xid: int, query: UnitQuery) -> tuple[sweep_columns.SweepColumns, list[Any]]:
    """The sweep read's dynamic fields (``args.<name>``, ``metrics.<name>.<stat>``) resolved for the query's
    filter and sort, and its ORDER BY (units without the value last, then wid)."""
    columns = sweep_columns.SweepColumns(xid, handlers.WORK_UNIT_FIELDS, handlers.WORK_UNIT_ORDER)
    sweep_columns.prepare(columns, query.filter, "")
    if query.sort.startswith(("arg:", "metric:")):
        if query.sort.startswith("arg:"):
            key: Any = F(columns.orderable[f"args.{query.sort[4:]}"])
        else:
            key = F(columns.orderable[f"metrics.{query.sort[7:]}.last"])
        first = key.desc(nulls_last=True) if query.desc else key.asc(nulls_last=True)
    else:
        # Never NULL: the plain direction, so an index on (experiment, key, wid) serves it either way.
        key = UNIT_SORTS.get(query.sort, UNIT_SORTS["wid"])
        first = key.desc() if query.desc else key.asc()
    order = [first, F("wid").desc() if query.desc else F("wid").asc()]
    return columns, order


def _filtered(xid: int, query: UnitQuery) -> tuple[QuerySet[WorkUnit], list[Any]]:
    """The units matching the query's filter (``InvalidArgument`` naming ``filter`` or ``sort``) and its order."""
    try:
        columns, order = _columns(xid, query)
    except (listing.ListingError, KeyError) as exc:
        raise InvalidArgument(f"cannot sort by {query.sort!r}: {exc}", field="sort") from None
    queryset = columns.apply(handlers.work_units_of(xid))
    if query.filter.strip():
        try:
            queryset = queryset.filter(listing.compile_filter(query.filter, columns.fields))
        except listing.ListingError as exc:
            raise InvalidArgument(str(exc), field="filter") from None
    return queryset, order


@dataclass(frozen=True)
class UnitPage:
    rows: list[dict[str, Any]]  # the page's work units, as `work_units` returns them, with their "metrics"
    total: int  # the work units matching the filter (all of them, not only this page)
    query: UnitQuery
    #: metric -> the best last value among every matching unit (by the column's goal), None without one
    best: dict[str, float | None] = field(default_factory=dict)

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.query.size))


def unit_page(xid: int, query: UnitQuery) -> UnitPage:
    """One page of the experiment's work units, filtered, sorted and counted in the database (caller checked).

    ``InvalidArgument`` (field ``filter``) for a filter the API would refuse. Two statements: the count
    of matching units, and the page's rows (the join on each unit's ACTIVE execution, ORDER BY, OFFSET).
    """
    queryset, order = _filtered(xid, query)
    total = unit_count(xid) if not query.filter.strip() else queryset.count()
    query = replace(query, page=max(1, min(query.page, -(-total // query.size))))  # past the end: the last page
    start = (query.page - 1) * query.size
    # The sort reads narrow rows (wid and the key); only the page's units are then read whole.
    wids = list(queryset.order_by(*order).values_list("wid", flat=True)[start:start + query.size])
    rows = units_in_order(xid, wids, query.metrics)
    goals = dict(query.goals)
    best = {metric: _best(xid, queryset if query.filter.strip() else None, metric, goals.get(metric, "min"))
            for metric in query.metrics}
    return UnitPage(rows, total, query, best)


def units_in_order(xid: int, wids: Sequence[int], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """The work units ``wids`` in that order (`work_units`), each with ``metrics``: metric -> its summary
    (``metrics.summaries.summaries_of``: one query)."""
    by_wid = {row["wid"]: row for row in work_units(xid, wids)}
    rows = [by_wid[w] for w in wids if w in by_wid]
    found = summaries.summaries_of(((row["id"], row["current_eid"]) for row in rows), metrics)
    for row in rows:
        row["metrics"] = found.get(row["id"], {})
    return rows


def with_metrics(unit: dict[str, Any], metrics: Sequence[str]) -> dict[str, Any]:
    """``unit`` (a `work_units` row) with its ``metrics`` summaries (one query; none asked: none read)."""
    found = summaries.summaries_of([(unit["id"], unit["current_eid"])], metrics) if metrics else {}
    return {**unit, "metrics": found.get(unit["id"], {})}


def _best(xid: int, matching: QuerySet[WorkUnit] | None, metric: str, goal: str) -> float | None:
    """The lowest (goal "min") or highest last value of ``metric`` over the current executions of the units
    ``matching`` selects (None: every unit of the experiment), from the summaries alone."""
    summaries_q = MetricSummary.objects.filter(experiment_id=xid, metric=metric, eid=F("work_unit__current_eid"))
    if matching is not None:
        summaries_q = summaries_q.filter(work_unit_id__in=matching.values("pk"))
    return summaries_q.aggregate(best=Min("last") if goal == "min" else Max("last"))["best"]


def unit_rows(xid: int, query: UnitQuery, chunk: int = 1_000) -> Iterator[list[dict[str, Any]]]:
    """Every work unit matching the query, in its order, ``chunk`` at a time (the table's export)."""
    queryset, order = _filtered(xid, query)
    batch: list[int] = []
    for wid in queryset.order_by(*order).values_list("wid", flat=True).iterator(chunk_size=chunk):
        batch.append(wid)
        if len(batch) == chunk:
            yield units_in_order(xid, batch, query.metrics)
            batch = []
    if batch:
        yield units_in_order(xid, batch, query.metrics)


def unit_count(xid: int) -> int:
    """How many work units experiment ``xid`` has: its roll-up of their states (``child_state_counts``,
    written in the same transaction as every create and state change), one row read."""
    counts = Experiment.objects.filter(id=xid).values_list("child_state_counts", flat=True).first() or {}
    return sum((int(n) for n in counts.values()), 0)


def sweep_args(xid: int) -> tuple[list[str], dict[str, str]]:
    """(the argument names whose values differ across the experiment's units, the arguments all share).

    The sweep read's statistics (``xmc.api.sweep_columns.arg_stats``: a few rows the create path keeps).
    """
    units = unit_count(xid)
    stats = sweep_columns.arg_stats(xid)
    shared = {name: stat.common for name, stat in sorted(stats.items())
              if stat.units == units and stat.common is not None}
    return sorted(name for name in stats if name not in shared), shared


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


def now() -> datetime:
    return timezone.now()


# --- Charts and dashboards -----------------------------------------------------------------------

def work_unit_charts(xid: int, wid: int) -> list[dict[str, Any]]:
    """The charts of one work unit (``Chart`` rows), oldest first (caller checked the role)."""
    rows = Chart.objects.filter(experiment_id=xid, work_unit__wid=wid).order_by("create_time", "id").values(
        "chart_id", "title", "description", "plots", "plot_layout")[:MAX_CHARTS]
    return [{**row, "xid": xid, "wid": wid} for row in rows]


def job_names(xid: int, wids: Iterable[int]) -> dict[int, str]:
    """wid -> the job name of those work units of experiment ``xid`` (a chart's legend; caller checked)."""
    wanted = sorted(set(wids))[:MAX_LEGEND_UNITS]
    rows = WorkUnit.objects.filter(experiment_id=xid, wid__in=wanted).values_list("wid", "executable")
    return {int(wid): arguments.job_name(executable) for wid, executable in rows}


def unit_args(xid: int, wids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """wid -> {"job": its job name, "args": its flattened arguments} (the compare view; caller checked)."""
    rows = WorkUnit.objects.filter(experiment_id=xid, wid__in=list(wids)).values_list("wid", "executable", "args")
    return {int(wid): {"job": arguments.job_name(executable), "args": dict(args or {})}
            for wid, executable, args in rows}


#: Work units a chart's legend names by job at most (beyond, by wid alone).
MAX_LEGEND_UNITS = 1_000


def metric_names(xid: int, wid: int) -> list[str]:
    """The metrics the work unit's newest execution has points of (caller checked the role)."""
    return chart_data.metric_names(xid, wid, limit=MAX_CHARTS)


def metric_chart_data(identity: Identity, xid: int, wid: int, metric: str | list[str], width: int,
                      title: str = "") -> tuple[Any, Any]:
    """(the default plot of ``metric``, its ``ChartData``) over the work unit's newest execution.

    Permission first, as the page (``xmc.api.reads.work_unit``: a stranger and a
    missing work unit alike raise), then GetChartData's evaluation. Several
    metrics (at most :data:`MAX_OVERLAID`) are drawn on one plot (the System
    group's per-GPU chart).
    """
    reads.work_unit(xid, wid, identity)
    metrics = [metric] if isinstance(metric, str) else list(metric)
    if not metrics or len(metrics) > MAX_OVERLAID or not all(specs.METRIC_PATTERN.fullmatch(m) for m in metrics):
        raise InvalidArgument(f"metric must be 1 to {MAX_OVERLAID} names of 1 to 256 printable characters",
                              field="metric")
    plot = plotdata.default_plot(*metrics, title=title[:200])
    return plot, chart_data.chart_data(f"experiments/{xid}/workUnits/{wid}", chart_data.Scope(xid, wid), [plot],
                                       width)


#: Metrics one default chart overlays at most.
MAX_OVERLAID = 64
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
