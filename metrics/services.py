"""Every write of dashboards, charts and metric points.

Called by the API handlers (``xmc.api.dashboards``, ``xmc.api.metrics_write``)
after they checked the caller's access; each public function is one durable
transaction and validates its input (`metrics.specs`) before writing.

Access rules that are the app's own live here too: `dashboard_role` (a
dashboard belongs to its owner, is shared through its ``acls`` with the
experiments' role model, and is readable by whoever may read every experiment
its charts show) and `accepting_execution` (whether an execution's metrics
token still writes).
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from core import pb
from core.choices import TERMINAL
from core.convert import from_json, to_json
from core.errors import AlreadyExists, InvalidArgument, NotFound
from core.identity import Identity
from experiments import acl
from experiments.acl import Role
from experiments.models import Experiment
from metrics import specs
from metrics.models import Chart, Dashboard, DashboardChart, MetricPoint
from metrics.wire import chart_to_proto
from workunits.choices import ExecutionState
from workunits.models import WorkUnit, WorkUnitExecution

CHART_MUTABLE = ("title", "description", "plots", "plot_layout")
CHART_FIXED = ("name", "xid", "wid", "create_time", "update_time")
DASHBOARD_MUTABLE = ("title", "description", "chart_layout", "chart_ids")
DASHBOARD_FIXED = ("name", "owner", "create_time", "update_time")


# --- Charts -----------------------------------------------------------------------------


def _chart_fields(chart: Any) -> dict[str, Any]:
    return {
        "title": chart.title,
        "description": chart.description,
        "plots": [to_json(plot) for plot in chart.plots],
        "plot_layout": to_json(chart.plot_layout),
    }


def _new_chart(work_unit: WorkUnit, message: Any, chart_id: str, creator: str, now: datetime,
               field: str) -> Chart:
    specs.check_chart(message, field)
    if chart_id:
        specs.check_id(chart_id, f"{field}_id" if field == "chart" else f"{field}.name")
    fields = _chart_fields(message)
    existing = Chart.objects.select_related("work_unit").filter(chart_id=chart_id).first() if chart_id else None
    if existing is not None:
        # A retried create (same work unit, same content) answers the chart it made.
        same = existing.work_unit_id == work_unit.pk and all(getattr(existing, k) == v for k, v in fields.items())
        if same:
            return existing
        raise AlreadyExists(f"chart {chart_id!r} already exists", field=f"{field}_id" if field == "chart" else field)
    chart = Chart(chart_id=chart_id or str(uuid.uuid4()), experiment_id=work_unit.experiment_id, work_unit=work_unit,
                  creator=creator, create_time=now, update_time=now, **fields)
    chart.save(force_insert=True)
    return chart


def create_chart(work_unit: WorkUnit, message: Any, chart_id: str, *, creator: str) -> Chart:
    """CreateChart under ``work_unit`` (access checked by the caller); idempotent on an identical retry."""
    with transaction.atomic(durable=True):
        return _new_chart(work_unit, message, chart_id, creator, timezone.now(), "chart")


def update_chart(chart: Chart, message: Any, paths: Sequence[str]) -> Chart:
    """UpdateChart with replace semantics per path; unknown and output-only paths are refused."""
    if not paths:
        raise InvalidArgument("update_mask must name at least one field", field="update_mask")
    for path in paths:
        if path in CHART_FIXED:
            raise InvalidArgument(f"update_mask: {path!r} cannot be changed", field="update_mask")
        if path not in CHART_MUTABLE:
            raise InvalidArgument(f"update_mask: unknown field {path!r} (updatable: {', '.join(CHART_MUTABLE)})",
                                  field="update_mask")
    merged = chart_to_proto(chart)
    for path in paths:
        merged.ClearField(path)
        if path in ("title", "description"):
            setattr(merged, path, getattr(message, path))
        elif path == "plots":
            merged.plots.extend(message.plots)
        else:
            merged.plot_layout.CopyFrom(message.plot_layout)
    specs.check_chart(merged, "chart")
    fields = _chart_fields(merged)
    with transaction.atomic(durable=True):
        Chart.objects.filter(pk=chart.pk).update(update_time=timezone.now(), **fields)
    return Chart.objects.select_related("work_unit").get(pk=chart.pk)


def delete_chart(chart: Chart) -> None:
    with transaction.atomic(durable=True):
        Chart.objects.filter(pk=chart.pk).delete()


def find_chart(chart_id: str) -> Chart | None:
    return Chart.objects.select_related("work_unit", "experiment").filter(chart_id=chart_id).first()


# --- Dashboards ---------------------------------------------------------------------------


def dashboard_role(identity: Identity, dashboard: Dashboard, chart_acls: Sequence[dict[str, Any]]) -> Role:
    """The caller's role on a dashboard whose charts' experiments have ``chart_acls``.

    Staff and the owner own it; its ``acls`` (an ``XidAcls``, as experiments
    have) give roles to others; and anyone who may read every experiment its
    charts show may read it (it shows them nothing they could not read anyway).
    """
    if identity.is_staff or identity.email == dashboard.owner:
        return Role.OWNER
    role = acl.role_of(identity, dashboard.acls or {})
    if role < Role.READER and chart_acls and all(acl.role_of(identity, a) >= Role.READER for a in chart_acls):
        role = Role.READER
    return role


def readable_dashboards(identity: Identity) -> QuerySet[Dashboard]:
    """Dashboards the caller may read (`dashboard_role` as one query)."""
    queryset = Dashboard.objects.all()
    if identity.is_staff:
        return queryset
    unreadable_chart = DashboardChart.objects.filter(dashboard=OuterRef("pk")).exclude(
        chart__experiment__in=Experiment.objects.filter(acl.readable_q(identity)))
    any_chart = DashboardChart.objects.filter(dashboard=OuterRef("pk"))
    shared = acl.readable_q(identity)  # the dashboard's own acls, in the experiments' shape
    return queryset.filter(Q(owner=identity.email) | shared | (Exists(any_chart) & ~Exists(unreadable_chart)))


def chart_ids_of(dashboard: Dashboard) -> list[str]:
    return list(DashboardChart.objects.filter(dashboard=dashboard).order_by("position")
                .values_list("chart__chart_id", flat=True))


def charts_of(dashboard: Dashboard) -> list[Chart]:
    return [link.chart for link in DashboardChart.objects.filter(dashboard=dashboard)
            .select_related("chart__work_unit", "chart__experiment").order_by("position")]


def _link(dashboard: Dashboard, charts: Iterable[Chart]) -> None:
    DashboardChart.objects.filter(dashboard=dashboard).delete()
    DashboardChart.objects.bulk_create(
        [DashboardChart(dashboard=dashboard, chart=chart, position=i) for i, chart in enumerate(charts)])


@dataclass(frozen=True)
class InlineChart:
    """A chart CreateDashboard creates in the same transaction (its work unit resolved and checked)."""

    work_unit: WorkUnit
    message: Any
    field: str


def create_dashboard(message: Any, dashboard_id: str, *, owner: str, referenced: Sequence[Chart],
                     inline: Sequence[InlineChart]) -> tuple[Dashboard, list[str]]:
    """CreateDashboard: the referenced charts, then the inline ones (created here), in that order."""
    specs.check_dashboard(message)
    if dashboard_id:
        specs.check_id(dashboard_id, "dashboard_id")
    now = timezone.now()
    with transaction.atomic(durable=True):
        if dashboard_id and Dashboard.objects.filter(dashboard_id=dashboard_id).exists():
            raise AlreadyExists(f"dashboards/{dashboard_id} already exists", field="dashboard_id")
        dashboard = Dashboard(dashboard_id=dashboard_id or str(uuid.uuid4()), title=message.title,
                              description=message.description, owner=owner,
                              chart_layout=to_json(message.chart_layout), create_time=now, update_time=now)
        dashboard.save(force_insert=True)
        created = [_new_chart(c.work_unit, c.message, "", owner, now, c.field) for c in inline]
        charts = [*referenced, *created]
        _link(dashboard, charts)
    return dashboard, [c.chart_id for c in charts]


def update_dashboard(dashboard: Dashboard, message: Any, paths: Sequence[str],
                     referenced: Sequence[Chart] | None) -> Dashboard:
    """UpdateDashboard; ``referenced`` are the charts of ``chart_ids`` when the mask names it."""
    if not paths:
        raise InvalidArgument("update_mask must name at least one field", field="update_mask")
    for path in paths:
        if path in DASHBOARD_FIXED:
            raise InvalidArgument(f"update_mask: {path!r} cannot be changed", field="update_mask")
        if path not in DASHBOARD_MUTABLE:
            raise InvalidArgument(
                f"update_mask: unknown field {path!r} (updatable: {', '.join(DASHBOARD_MUTABLE)})",
                field="update_mask")
    merged = pb.dashboard.Dashboard(
        title=message.title if "title" in paths else dashboard.title,
        description=message.description if "description" in paths else dashboard.description,
    )
    if "chart_layout" in paths:
        merged.chart_layout.CopyFrom(message.chart_layout)
    if "chart_ids" in paths:
        merged.chart_ids.extend(message.chart_ids)
    specs.check_dashboard(merged)
    fields: dict[str, Any] = {"title": merged.title, "description": merged.description}
    if "chart_layout" in paths:
        fields["chart_layout"] = to_json(merged.chart_layout)
    with transaction.atomic(durable=True):
        Dashboard.objects.filter(pk=dashboard.pk).update(update_time=timezone.now(), **fields)
        if referenced is not None:
            _link(dashboard, referenced)
    return Dashboard.objects.get(pk=dashboard.pk)


def set_dashboard_acls(dashboard: Dashboard, acls: Any) -> Dashboard:
    """Share a dashboard: its ``acls`` (an ``XidAcls`` as proto3 JSON), normalized as experiments' are."""
    message = from_json(pb.xid.XidAcls, acls or {}, field="acls")
    with transaction.atomic(durable=True):
        Dashboard.objects.filter(pk=dashboard.pk).update(acls=acl.normalize_acls(to_json(message)),
                                                         update_time=timezone.now())
    return Dashboard.objects.get(pk=dashboard.pk)


def delete_dashboard(dashboard: Dashboard) -> None:
    with transaction.atomic(durable=True):
        Dashboard.objects.filter(pk=dashboard.pk).delete()


# --- Points -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    metric: str
    step: int
    value: float
    time: datetime


def accepting_execution(xid: int, wid: int, eid: int, *, now: datetime | None = None) -> int | None:
    """The pk of execution (xid, wid, eid) if its metrics token still writes, else None.

    It writes while the execution is the work unit's active one and not in a
    terminal state, and for ``XMC_METRICS_TOKEN_GRACE_S`` after it ended (its
    ``complete_time``, or its last update when a restart superseded it).
    """
    row = (WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid, eid=eid)
           .values("pk", "execution_state", "state", "complete_time", "update_time").first())
    if row is None:
        return None
    live = row["execution_state"] == ExecutionState.ACTIVE and row["state"] not in TERMINAL
    if live:
        return int(row["pk"])
    ended = row["complete_time"] or row["update_time"]
    grace = timedelta(seconds=settings.XMC_METRICS_TOKEN_GRACE_S)
    return int(row["pk"]) if (now or timezone.now()) <= ended + grace else None


def execution_pk(xid: int, wid: int, eid: int | None) -> int | None:
    """The pk of execution ``eid`` of a work unit (None: its current execution), or None."""
    queryset = WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid)
    if eid is None:
        queryset = queryset.filter(eid=WorkUnit.objects.filter(experiment_id=xid, wid=wid).values("current_eid")[:1])
    else:
        queryset = queryset.filter(eid=eid)
    return queryset.values_list("pk", flat=True).first()


_INSERT = (
    f"INSERT INTO {MetricPoint._meta.db_table} (execution_id, metric, step, value, time) "
    "SELECT %s, m, s, v, t FROM unnest(%s::text[], %s::bigint[], %s::float8[], %s::timestamptz[]) AS p(m, s, v, t) "
    "ON CONFLICT (execution_id, metric, step) DO NOTHING"
)


def write_points(execution: int, points: Sequence[Point]) -> int:
    """Insert ``points`` of one execution in one statement; returns how many were new.

    Idempotent on (execution, metric, step): a replayed batch (or a point
    repeated within one) adds nothing; the first value written stays.
    """
    if not points:
        return 0
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(_INSERT, [execution, [p.metric for p in points], [p.step for p in points],
                                 [p.value for p in points], [p.time for p in points]])
        return int(cursor.rowcount)


def require_chart(chart_id: str) -> Chart:
    chart = find_chart(chart_id)
    if chart is None:
        raise NotFound(f"charts/{chart_id} not found")
    return chart


#: Points deleted per statement by `purge_points` (short transactions, no long lock on the table).
PURGE_BATCH = 50_000


def purge_points(*, older_than: datetime, batch: int = PURGE_BATCH) -> int:
    """Delete points with ``time`` before ``older_than``, in batches; returns how many went.

    The BRIN index on ``time`` finds the old block ranges; each batch is its own transaction.
    """
    total = 0
    table = MetricPoint._meta.db_table
    while True:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE time < %s LIMIT %s)",
                           [older_than, batch])
            deleted = int(cursor.rowcount)
        total += deleted
        if deleted < batch:
            return total
