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
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from core import pb
from core.keys import ExecutionKey
from core.choices import TERMINAL
from core.convert import from_json, to_json
from core.errors import AlreadyExists, InvalidArgument
from core.identity import Identity
from experiments import acl
from experiments.acl import Role
from experiments.models import Experiment
from metrics import hooks, specs
from metrics.models import (
    BLOCK_SIZES,
    EAGER_BLOCK_SIZES,
    LAZY_BLOCK_SIZES,
    Chart,
    Dashboard,
    DashboardChart,
    MetricPoint,
    MetricSummary,
    PendingBlock,
    PointBlock,
    PointSpan,
)
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
    # Chart ids are unique per work unit: only charts the caller may already list (a reader of the
    # experiment) can collide, so the answer tells them nothing new.
    existing = (Chart.objects.select_related("work_unit").filter(work_unit=work_unit, chart_id=chart_id).first()
                if chart_id else None)
    if existing is not None:
        # A retried create (same work unit, same content) answers the chart it made.
        if all(getattr(existing, k) == v for k, v in fields.items()):
            return existing
        raise AlreadyExists(f"chart {chart_id!r} already exists in experiments/{work_unit.experiment_id}/workUnits/"
                            f"{work_unit.wid}", field=f"{field}_id" if field == "chart" else field)
    chart = Chart(chart_id=chart_id or str(uuid.uuid4()), experiment_id=work_unit.experiment_id, work_unit=work_unit,
                  creator=creator, create_time=now, update_time=now, **fields)
    try:
        with transaction.atomic():
            chart.save(force_insert=True)
    except IntegrityError:  # a concurrent create of the same id won
        raise AlreadyExists(f"chart {chart_id!r} already exists",
                            field=f"{field}_id" if field == "chart" else field) from None
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


def find_chart(xid: int, wid: int, chart_id: str) -> Chart | None:
    """The chart ``experiments/{xid}/workUnits/{wid}/charts/{chart_id}`` (access is the caller's to check)."""
    return (Chart.objects.select_related("work_unit", "experiment")
            .filter(experiment_id=xid, work_unit__wid=wid, chart_id=chart_id).first())


def readable_charts_with_id(identity: Identity, chart_id: str, *, dashboard: Dashboard | None = None) -> list[Chart]:
    """The charts called ``chart_id`` the caller may read (of ``dashboard`` only, if given), at most two:
    what the short names ``charts/{id}`` and ``dashboards/{d}/charts/{id}`` may mean."""
    queryset = Chart.objects.select_related("work_unit", "experiment").filter(chart_id=chart_id)
    if not identity.is_staff:
        queryset = queryset.filter(acl.readable_q(identity, prefix="experiment__"))
    if dashboard is not None:
        queryset = queryset.filter(dashboardchart__dashboard=dashboard)
    return list(queryset.order_by("id")[:2])


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


def visible_dashboards_with_id(identity: Identity, dashboard_id: str) -> list[Dashboard]:
    """What ``dashboards/{dashboard_id}`` means to the caller: their own dashboard of that id, else
    those of that id they may read (at most two). Ids are unique per owner, so another's
    dashboard is found only by those it is shared with, and never shadows the caller's own."""
    own = Dashboard.objects.filter(owner=identity.email, dashboard_id=dashboard_id).first()
    if own is not None:
        return [own]
    return list(readable_dashboards(identity).filter(dashboard_id=dashboard_id).order_by("id")[:2])


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
        # Ids are unique per owner: only the caller's own dashboards can collide.
        if dashboard_id and Dashboard.objects.filter(owner=owner, dashboard_id=dashboard_id).exists():
            raise AlreadyExists(f"you already have dashboards/{dashboard_id}", field="dashboard_id")
        dashboard = Dashboard(dashboard_id=dashboard_id or str(uuid.uuid4()), title=message.title,
                              description=message.description, owner=owner,
                              chart_layout=to_json(message.chart_layout), create_time=now, update_time=now)
        try:
            with transaction.atomic():
                dashboard.save(force_insert=True)
        except IntegrityError:  # a concurrent create of the same id won
            raise AlreadyExists(f"you already have dashboards/{dashboard_id}", field="dashboard_id") from None
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


class Point(NamedTuple):
    """One point of a write (a tuple: the write path makes thousands per call)."""

    metric: str
    step: int
    value: float
    time: datetime


_ACCEPTING = (
    f"SELECT e.id, e.execution_state, e.state, e.complete_time, e.update_time FROM {WorkUnitExecution._meta.db_table} e "
    f"JOIN {WorkUnit._meta.db_table} w ON w.id = e.work_unit_id WHERE w.experiment_id = %s AND w.wid = %s AND e.eid = %s"
)


def accepting_execution(xid: int, wid: int, eid: int, *, now: datetime | None = None) -> int | None:
    """The pk of execution (xid, wid, eid) if its metrics token still writes, else None.

    It writes while the execution is the work unit's active one and not in a
    terminal state, and for ``XMC_METRICS_TOKEN_GRACE_S`` after it ended (its
    ``complete_time``, or its last update when a restart superseded it).
    """
    with connection.cursor() as cursor:  # on every write: one statement, not an ORM query to compile
        cursor.execute(_ACCEPTING, [xid, wid, eid])
        row = cursor.fetchone()
    if row is None:
        return None
    pk, execution_state, state, complete_time, update_time = row
    if execution_state == ExecutionState.ACTIVE and state not in TERMINAL:
        return int(pk)
    ended = complete_time or update_time
    grace = timedelta(seconds=settings.XMC_METRICS_TOKEN_GRACE_S)
    return int(pk) if (now or timezone.now()) <= ended + grace else None


def execution_pk(xid: int, wid: int, eid: int | None) -> int | None:
    """The pk of execution ``eid`` of a work unit (None: its current execution), or None."""
    queryset = WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid)
    if eid is None:
        queryset = queryset.filter(eid=WorkUnit.objects.filter(experiment_id=xid, wid=wid).values("current_eid")[:1])
    else:
        queryset = queryset.filter(eid=eid)
    return queryset.values_list("pk", flat=True).first()


_POINTS = MetricPoint._meta.db_table
_SPANS = PointSpan._meta.db_table
_BLOCKS = PointBlock._meta.db_table
_SUMMARIES = MetricSummary._meta.db_table
_PENDING = PendingBlock._meta.db_table
#: The session's staging table. COPY fills it; the commit empties it in place (ON COMMIT DELETE ROWS:
#: no dead rows pile up, temporary tables are never vacuumed); a write inside a caller's transaction
#: (tests) empties it itself.
_STAGE = "pg_temp.xmc_metric_stage"
_CREATE_STAGE = (f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE.removeprefix('pg_temp.')} "
                 "(n int, metric text, step bigint, value float8, time timestamptz) ON COMMIT DELETE ROWS")
#: Binary COPY: no text formatting in Python nor parsing in Postgres (twice as fast as text for these rows).
_COPY = f"COPY {_STAGE} (n, metric, step, value, time) FROM STDIN (FORMAT BINARY)"
_COPY_TYPES = ("int4", "text", "int8", "float8", "timestamptz")
#: Connections (psycopg's) whose session has the staging table, committed.
_STAGED: weakref.WeakSet[Any] = weakref.WeakSet()

#: The execution's span, locked: the writers of one execution take turns until commit (a second writer of
#: the same batch waits here, then its next statement sees the first one's points).
_LOCK_SPAN = f"SELECT first_time, last_time, last_step FROM {_SPANS} WHERE execution_id = %s FOR UPDATE"
#: The first write of an execution: no points to repeat (a concurrent first writer gets nothing and locks).
_NEW_SPAN = (f"INSERT INTO {_SPANS} (execution_id, first_time, last_time, last_step) VALUES (%s, %s, %s, %s) "
             "ON CONFLICT (execution_id) DO NOTHING RETURNING 1")
_WIDEN_SPAN = (f"UPDATE {_SPANS} SET first_time = least(first_time, %(first)s), last_time = greatest(last_time, "
               "%(last)s), last_step = greatest(last_step, %(last_step)s) WHERE execution_id = %(execution)s")

def floor_div_sql(a: str, b: str) -> str:
    """SQL for floor(a / b) of integers (b > 0; "/" truncates toward zero, and -a may not overflow)."""
    return f"CASE WHEN {a} >= 0 THEN {a} / {b} ELSE -1 - (-({a} + 1)) / {b} END"


#: The staged points not already stored (the first occurrence in the batch wins), in one statement
#: with the span's update, the new points added to their blocks (`PointBlock`, every size) and to their
#: metric's summary (`MetricSummary`, `_SUMMARIES_CTE`).
_INSERT_POINTS_AND_BLOCKS = (
    "WITH {widen} new AS ("
    f"INSERT INTO {_POINTS} (execution_id, metric, step, value, time) "
    f"SELECT DISTINCT ON (s.metric, s.step) %(execution)s, s.metric, s.step, s.value, s.time FROM {_STAGE} s "
    "{probe} ORDER BY s.metric, s.step, s.n RETURNING metric, step, value, time), "
    # The finest blocks from the new points, every coarser size from those (sizes are multiples of 16).
    f"fine AS (SELECT metric, {floor_div_sql('step', str(BLOCK_SIZES[0]))} AS block, count(*) AS count, sum(value) AS sum, "
    "min(value) AS min, max(value) AS max, max(step) AS last_step, max(time) AS last_time FROM new GROUP BY 1, 2), "
    f"blocks AS (INSERT INTO {_BLOCKS} AS b (execution_id, metric, size, block, count, sum, min, max, last_step, "
    f"last_time) SELECT %(execution)s, f.metric, z.size, {floor_div_sql('f.block', f'(z.size / {BLOCK_SIZES[0]})')}, "
    "sum(f.count), sum(f.sum), min(f.min), max(f.max), max(f.last_step), max(f.last_time) "
    "FROM fine f CROSS JOIN unnest(%(sizes)s::bigint[]) AS z(size) GROUP BY 2, 3, 4 "
    "ON CONFLICT (execution_id, metric, size, block) DO UPDATE SET count = b.count + excluded.count, "
    "sum = b.sum + excluded.sum, min = least(b.min, excluded.min), max = greatest(b.max, excluded.max), "
    "last_step = greatest(b.last_step, excluded.last_step), last_time = greatest(b.last_time, excluded.last_time)), "
)
#: One summary row per metric of the batch (`MetricSummary`): GREATEST/LEAST per batch, never a scan of points.
#: The last value is the one at the highest step (steps are unique per metric: only new points are here).
#: (bench/metrics.py measures the ingest with and without it.)
_SUMMARIES_CTE = (
    f"summaries AS (INSERT INTO {_SUMMARIES} AS m (work_unit_id, eid, metric, experiment_id, last, last_step, min, "
    "max, count, first_time, last_time) SELECT x.work_unit_id, x.eid, n.metric, w.experiment_id, "
    "(array_agg(n.value ORDER BY n.step DESC))[1], max(n.step), min(n.value), max(n.value), count(*), min(n.time), "
    f"max(n.time) FROM new n CROSS JOIN {WorkUnitExecution._meta.db_table} x JOIN {WorkUnit._meta.db_table} w "
    "ON w.id = x.work_unit_id WHERE x.id = %(execution)s GROUP BY x.work_unit_id, x.eid, n.metric, w.experiment_id "
    "ON CONFLICT (work_unit_id, eid, metric) DO UPDATE SET "
    "last = CASE WHEN excluded.last_step > m.last_step THEN excluded.last ELSE m.last END, "
    "last_step = greatest(m.last_step, excluded.last_step), min = least(m.min, excluded.min), "
    "max = greatest(m.max, excluded.max), count = m.count + excluded.count, "
    "first_time = least(m.first_time, excluded.first_time), last_time = greatest(m.last_time, excluded.last_time)) "
)
_INSERT = _INSERT_POINTS_AND_BLOCKS + _SUMMARIES_CTE + "SELECT count(*) FROM new"
#: The duplicate probe, only when the batch has a step the execution already has: one (execution, metric,
#: step) lookup per point in the partitions the span covers (literal bounds: the planner prunes the rest).
_PROBE = (
    f"LEFT JOIN LATERAL (SELECT 1 AS hit FROM {_POINTS} p WHERE p.execution_id = %(execution)s "
    "AND p.metric = s.metric AND p.step = s.step AND p.time BETWEEN %(span_first)s AND %(span_last)s LIMIT 1) d "
    "ON TRUE WHERE d.hit IS NULL"
)


def _lock_span(cursor: Any, execution: int, first: datetime, last: datetime,
               last_step: int) -> tuple[datetime, datetime, int] | None:
    """Lock the execution's span; its (first time, last time, last step) before this write, None if new."""
    while True:
        cursor.execute(_LOCK_SPAN, [execution])
        row = cursor.fetchone()
        if row is not None:
            return row[0], row[1], int(row[2])
        cursor.execute(_NEW_SPAN, [execution, first, last, last_step])
        if cursor.fetchone() is not None:
            return None
        # Another first writer inserted it meanwhile (and has committed): lock that one.


def write_points(execution: int, points: Sequence[Point]) -> int:
    """Store ``points`` of one execution; returns how many were new.

    Idempotent on (execution, metric, step): a replayed batch (or a point
    repeated within one) adds nothing, whatever its times; the first value
    written stays. One transaction: COPY into the session's staging table,
    lock the execution's `PointSpan`, INSERT ... SELECT the staged points
    (skipping those already stored when the batch has steps the execution
    already has), add the new ones to their `PointBlock` rows and their
    metric's `MetricSummary` row, and widen the span. After the commit, when it added points, `metrics.hooks.written_hooks`
    hear of it (the open charts of that work unit read their data again).
    """
    if not points:
        return 0
    first = min(p.time for p in points)
    last = max(p.time for p in points)
    first_step = min(p.step for p in points)
    last_step = max(p.step for p in points)
    nested = connection.in_atomic_block
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        raw = cursor.cursor
        if raw.connection not in _STAGED:
            cursor.execute(_CREATE_STAGE)
        with raw.copy(_COPY) as copy:
            copy.set_types(_COPY_TYPES)
            write_row = copy.write_row
            for n, point in enumerate(points):
                write_row((n, *point))
        span = _lock_span(cursor, execution, first, last, last_step)
        params: dict[str, Any] = {"execution": execution, "first": first, "last": last, "last_step": last_step,
                                  "sizes": list(BLOCK_SIZES)}
        widen = probe = ""
        if span is not None:
            widen = f"span AS ({_WIDEN_SPAN}),"
            if first_step <= span[2]:
                probe = _PROBE
                params.update(span_first=span[0], span_last=span[1])
        cursor.execute(_INSERT.replace("{widen}", widen).replace("{probe}", probe), params)
        written = int(cursor.fetchone()[0])
        if nested:
            cursor.execute(f"DELETE FROM {_STAGE}")
    if not nested:
        _STAGED.add(raw.connection)
    if written:
        hooks.on_points_written({execution: written})
    return written


#: `write_points_many`: one staging table for the points of many executions.
_STAGE_MANY = "pg_temp.xmc_metric_stage_many"
_CREATE_STAGE_MANY = (f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE_MANY.removeprefix('pg_temp.')} "
                      "(execution bigint, metric text, step bigint, value float8, time timestamptz) ON COMMIT DELETE ROWS")
_COPY_MANY = f"COPY {_STAGE_MANY} (execution, metric, step, value, time) FROM STDIN (FORMAT BINARY)"
_COPY_MANY_TYPES = ("int8", "text", "int8", "float8", "timestamptz")
_STAGED_MANY: weakref.WeakSet[Any] = weakref.WeakSet()
#: Every execution's span widened (and locked, in execution order) before any of its points is written.
_WIDEN_SPANS = (
    f"INSERT INTO {_SPANS} AS p (execution_id, first_time, last_time, last_step) SELECT execution, min(time), "
    f"max(time), max(step) FROM {_STAGE_MANY} GROUP BY execution ORDER BY execution ON CONFLICT (execution_id) DO UPDATE "
    "SET first_time = least(p.first_time, excluded.first_time), last_time = greatest(p.last_time, excluded.last_time), "
    "last_step = greatest(p.last_step, excluded.last_step)"
)
#: The sizes between the eager ones: later, from these rows (`roll_up_blocks`): a plain insert, no upsert a size.
_PENDING_CTE = (
    f"pending AS (INSERT INTO {_PENDING} (execution_id, metric, block, count, sum, min, max, last_step, last_time) "
    "SELECT execution_id, metric, block, count, sum, min, max, last_step, last_time FROM fine), "
)
#: The new points (a repeated (execution, metric, step, time) is skipped by the primary key), their blocks and
#: their summaries, in one statement: the same rows `_INSERT` writes for one execution, for many.
_INSERT_MANY = (
    f"WITH new AS (INSERT INTO {_POINTS} (execution_id, metric, step, value, time) "
    f"SELECT DISTINCT ON (s.execution, s.metric, s.step) s.execution, s.metric, s.step, s.value, s.time FROM {_STAGE_MANY} s "
    "ORDER BY s.execution, s.metric, s.step ON CONFLICT (execution_id, metric, step, time) DO NOTHING "
    "RETURNING execution_id, metric, step, value, time), "
    f"fine AS (SELECT execution_id, metric, {floor_div_sql('step', str(BLOCK_SIZES[0]))} AS block, count(*) AS count, "
    "sum(value) AS sum, min(value) AS min, max(value) AS max, max(step) AS last_step, max(time) AS last_time "
    "FROM new GROUP BY 1, 2, 3), "
    f"blocks AS (INSERT INTO {_BLOCKS} AS b (execution_id, metric, size, block, count, sum, min, max, last_step, "
    f"last_time) SELECT f.execution_id, f.metric, z.size, {floor_div_sql('f.block', f'(z.size / {BLOCK_SIZES[0]})')}, "
    "sum(f.count), sum(f.sum), min(f.min), max(f.max), max(f.last_step), max(f.last_time) "
    "FROM fine f CROSS JOIN unnest(%(sizes)s::bigint[]) AS z(size) GROUP BY 1, 2, 3, 4 "
    "ON CONFLICT (execution_id, metric, size, block) DO UPDATE SET count = b.count + excluded.count, "
    "sum = b.sum + excluded.sum, min = least(b.min, excluded.min), max = greatest(b.max, excluded.max), "
    "last_step = greatest(b.last_step, excluded.last_step), last_time = greatest(b.last_time, excluded.last_time)), "
    f"{_PENDING_CTE}"
    f"summaries AS (INSERT INTO {_SUMMARIES} AS m (work_unit_id, eid, metric, experiment_id, last, last_step, min, "
    "max, count, first_time, last_time) SELECT x.work_unit_id, x.eid, n.metric, w.experiment_id, "
    "(array_agg(n.value ORDER BY n.step DESC))[1], max(n.step), min(n.value), max(n.value), count(*), min(n.time), "
    f"max(n.time) FROM new n JOIN {WorkUnitExecution._meta.db_table} x ON x.id = n.execution_id "
    f"JOIN {WorkUnit._meta.db_table} w ON w.id = x.work_unit_id GROUP BY x.work_unit_id, x.eid, n.metric, w.experiment_id "
    "ON CONFLICT (work_unit_id, eid, metric) DO UPDATE SET "
    "last = CASE WHEN excluded.last_step > m.last_step THEN excluded.last ELSE m.last END, "
    "last_step = greatest(m.last_step, excluded.last_step), min = least(m.min, excluded.min), "
    "max = greatest(m.max, excluded.max), count = m.count + excluded.count, "
    "first_time = least(m.first_time, excluded.first_time), last_time = greatest(m.last_time, excluded.last_time)) "
    "SELECT execution_id, count(*) FROM new GROUP BY 1"
)


def write_points_many(batches: Sequence[tuple[int, Sequence[Point]]]) -> int:
    """Store the points of many executions in one transaction; how many were new.

    For writers whose step always comes with the same time (the system metrics'
    collector, `metrics.system`: step = seconds since the execution's creation at
    the cycle's instant): a point already stored with the same (execution,
    metric, step, time) is skipped by the points' primary key, so a replayed batch
    adds nothing, as with `write_points`. The spans are widened (and locked, in
    execution order) first; then one statement inserts the points, their blocks
    of `EAGER_BLOCK_SIZES` (2 upserts a series, not 31), a `PendingBlock` row per
    finest block for the sizes between (`roll_up_blocks` adds them later, or the
    chart read that needs them first) and their summaries. ``metrics.hooks.written_hooks`` hear of the
    executions with new points after the commit, all at once.
    """
    rows = [(execution, p) for execution, points in batches for p in points]
    if not rows:
        return 0
    nested = connection.in_atomic_block
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        raw = cursor.cursor
        if raw.connection not in _STAGED_MANY:
            cursor.execute(_CREATE_STAGE_MANY)
        with raw.copy(_COPY_MANY) as copy:
            copy.set_types(_COPY_MANY_TYPES)
            write_row = copy.write_row
            for execution, point in rows:
                write_row((execution, *point))
        cursor.execute(_WIDEN_SPANS)
        cursor.execute(_INSERT_MANY, {"sizes": list(EAGER_BLOCK_SIZES)})
        written = {int(execution): int(n) for execution, n in cursor.fetchall()}
        if nested:
            cursor.execute(f"DELETE FROM {_STAGE_MANY}")
    if not nested:
        _STAGED_MANY.add(raw.connection)
    hooks.on_points_written(dict(sorted(written.items())))
    return sum(written.values())


#: The pending rows of the executions ``{where}`` selects, deleted and added to their blocks of
#: `LAZY_BLOCK_SIZES` in one statement (a concurrent roll-up of the same rows waits on their delete and
#: then finds them gone: nothing is added twice); blocks in key order, so two roll-ups lock them alike.
_ROLL_UP = (
    f"WITH d AS (DELETE FROM {_PENDING} p WHERE {{where}} RETURNING p.execution_id, p.metric, p.block, p.count, "
    "p.sum, p.min, p.max, p.last_step, p.last_time) "
    f"INSERT INTO {_BLOCKS} AS b (execution_id, metric, size, block, count, sum, min, max, last_step, last_time) "
    f"SELECT d.execution_id, d.metric, z.size, {floor_div_sql('d.block', f'(z.size / {BLOCK_SIZES[0]})')}, "
    "sum(d.count), sum(d.sum), min(d.min), max(d.max), max(d.last_step), max(d.last_time) "
    "FROM d CROSS JOIN unnest(%(sizes)s::bigint[]) AS z(size) GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4 "
    "ON CONFLICT (execution_id, metric, size, block) DO UPDATE SET count = b.count + excluded.count, "
    "sum = b.sum + excluded.sum, min = least(b.min, excluded.min), max = greatest(b.max, excluded.max), "
    "last_step = greatest(b.last_step, excluded.last_step), last_time = greatest(b.last_time, excluded.last_time)"
)


def roll_up_blocks(cursor: Any | None = None, where: str = "TRUE", params: Sequence[Any] = ()) -> int:
    """Add the `PendingBlock` rows ``where`` selects (a condition on ``p``; default all) to their
    `PointBlock` rows of `LAZY_BLOCK_SIZES`, deleting them, in one statement; returns how many blocks
    it added to. The periodic pass (`metrics.tasks.roll_up_blocks`) runs it over everything; a chart read
    at one of those sizes runs it over its executions first (`metrics.data`), so it sees every point."""
    sql = _ROLL_UP.replace("{where}", where)
    if cursor is None:
        with connection.cursor() as own:
            return roll_up_blocks(own, where, params)
    sizes = ", ".join(str(size) for size in LAZY_BLOCK_SIZES)
    cursor.execute(sql.replace("%(sizes)s", f"ARRAY[{sizes}]"), list(params))
    return int(cursor.rowcount)


def execution_keys(executions: Iterable[int]) -> dict[int, ExecutionKey]:
    """(xid, wid, eid) of the executions with these primary keys, by pk (one query; a pk with no row is left out)."""
    rows = (WorkUnitExecution.objects.filter(pk__in=list(executions))
            .values_list("pk", "work_unit__experiment_id", "work_unit__wid", "eid"))
    return {pk: ExecutionKey(xid, wid, eid) for pk, xid, wid, eid in rows}

