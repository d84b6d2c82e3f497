"""Fixtures of the metrics tests: the session gRPC server, a DashboardService stub, worlds with points."""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import pytest

from core import pb, ratelimit
from metrics import services
from tests import factories
from tests.api.grpc_server.conftest import (  # noqa: F401 - the shared session server
    _server_connections_closed_after_each_test,
    channel,
    grpc_server,
    grpc_target,
    metadata_for,
)
from workunits.models import WorkUnit, WorkUnitExecution

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)


@pytest.fixture
def dash(channel: grpc.Channel) -> Any:  # noqa: F811
    return pb.dashboard_grpc.DashboardServiceStub(channel)


def experiment_for(owner: str, *, readers: tuple[str, ...] = (), writers: tuple[str, ...] = ()) -> Any:
    acls = pb.xid.XidAcls(owners=[pb.xid.XidAcls.Role(user=owner)],
                          readers=[pb.xid.XidAcls.Role(user=r) for r in readers],
                          writers=[pb.xid.XidAcls.Role(user=w) for w in writers])
    return factories.experiment(owner, title="metrics", acls=acls)


def fresh_write_buckets(*units: WorkUnit) -> None:
    """Forget the metrics:write rate buckets of these units' executions (Redis outlives the test
    database, whose ids repeat: an earlier test may have drained a bucket of the same id)."""
    for unit in units:
        for pk in unit.executions.values_list("pk", flat=True):
            ratelimit.get_rate_limiter().reset(f"metrics-write:{pk}")


def execution_of(work_unit: WorkUnit, eid: int | None = None) -> WorkUnitExecution:
    return WorkUnitExecution.objects.get(work_unit=work_unit, eid=eid or work_unit.current_eid)


def write(work_unit: WorkUnit, metric: str, values: list[float], *, start: int = 0, eid: int | None = None,
          every_s: float = 1.0) -> None:
    """Points ``values`` at steps start, start+1, ... one second apart."""
    execution = execution_of(work_unit, eid)
    services.write_points(execution.pk, [
        services.Point(metric, start + i, v, T0 + timedelta(seconds=every_s * (start + i))) for i, v in enumerate(values)
    ])


def scatter(plot_id: str, *metrics: str, **kw: Any) -> Any:
    return pb.dashboard.PlotSpec(plot_id=plot_id, type=pb.dashboard.SCATTER,
                                 data=pb.dashboard.DataSpec(metrics=list(metrics)), **kw)


def chart_message(*plots: Any, title: str = "Loss") -> Any:
    return pb.dashboard.Chart(title=title, plots=list(plots) or [scatter("loss", "loss")],
                              plot_layout=pb.dashboard.LayoutSpec(type=pb.dashboard.LayoutSpec.GRID, columns=2))


@pytest.fixture
def persona(fresh_email: Callable[[str], str]) -> Callable[[str], tuple[str, list[tuple[str, str]]]]:  # noqa: F811
    """``persona("alice")``: a fresh email and its call metadata."""
    def make(who: str) -> tuple[str, list[tuple[str, str]]]:
        email = fresh_email(who)
        return email, metadata_for(email)

    return make


def summaries_from_points() -> dict[tuple[int, int, str], tuple[Any, ...]]:
    """Every metric summary as the points say it should be: (work unit pk, eid, metric) ->
    (last, last_step, min, max, count, first_time, last_time, xid); the oracle of `MetricSummary`."""
    from metrics.models import MetricPoint

    out: dict[tuple[int, int, str], tuple[Any, ...]] = {}
    rows = MetricPoint.objects.values_list("execution__work_unit_id", "execution__eid", "metric", "step", "value",
                                           "time", "execution__work_unit__experiment_id")
    grouped: dict[tuple[int, int, str], list[tuple[Any, ...]]] = {}
    for unit, eid, metric, step, value, time, xid in rows:
        grouped.setdefault((unit, eid, metric), []).append((step, value, time, xid))
    for key, points in grouped.items():
        points.sort()
        values = [p[1] for p in points]
        out[key] = (points[-1][1], points[-1][0], min(values), max(values), len(points),
                    min(p[2] for p in points), max(p[2] for p in points), points[0][3])
    return out


def stored_summaries() -> dict[tuple[int, int, str], tuple[Any, ...]]:
    """What the write path kept, in the shape of `summaries_from_points`."""
    from metrics.models import MetricSummary

    return {(r[0], r[1], r[2]): tuple(r[3:]) for r in MetricSummary.objects.values_list(
        "work_unit_id", "eid", "metric", "last", "last_step", "min", "max", "count", "first_time", "last_time",
        "experiment_id")}
