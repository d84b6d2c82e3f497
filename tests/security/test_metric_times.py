"""Issue 40, item 10: a metric point from year 9999 is refused on every write path, and none stays stored.

The attacker holds a metrics token (every container of a job does) or write
rights, and sends a point dated far ahead. Stored, it sat in the DEFAULT
partition where retention's cutoff never reached it. Now each path answers
INVALID_ARGUMENT naming ``points[i].time``; the shipped writer on a machine
whose clock runs ahead resends with the server's time; and maintenance deletes
any future point already stored, its blocks rebuilt from what is left.
"""
from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import grpc
import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone as dj_timezone

from core.protos import metrics_pb2
from metrics import partitions, services, tasks, tokens
from metrics.models import BLOCK_SIZES, MetricPoint, PointBlock, PointSpan
from tests import factories
from tests.api.grpc_server.conftest import (  # noqa: F401 - the shared session server
    _server_connections_closed_after_each_test,
    channel,
    grpc_server,
    grpc_target,
)
from tests.metrics.conftest import experiment_for, fresh_write_buckets
from workunits.models import WorkUnit, WorkUnitExecution

SRC = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))
import xmc_metrics  # noqa: E402

FAR = "9999-12-31T23:59:59Z"


@pytest.fixture
def unit(db: None) -> WorkUnit:
    work_unit = factories.work_unit(experiment_for("alice@example.com"), wid=1)
    fresh_write_buckets(work_unit)
    return work_unit


def _post(unit: WorkUnit, points: list[dict[str, Any]]) -> Any:
    return Client().post(f"/v1/experiments/{unit.experiment_id}/workUnits/1/metrics:write",
                         json.dumps({"points": points}), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {tokens.token_for(unit.experiment_id, 1, 1)}")


def test_it_refuses_a_point_from_year_9999_over_rest(unit: WorkUnit, settings: Any) -> None:
    settings.XMC_METRICS_MAX_FUTURE_S = 3600
    response = _post(unit, [{"metric": "loss", "step": 1, "value": 1.0},
                            {"metric": "loss", "step": 2, "value": 1.0, "time": FAR}])
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and "XMC_METRICS_MAX_FUTURE_S" in error["message"]
    assert error["details"][0]["fieldViolations"][0]["field"] == "points[1].time"
    assert MetricPoint.objects.count() == 0
    # A clock a little fast is fine.
    soon = (dj_timezone.now() + timedelta(seconds=3000)).isoformat()
    assert _post(unit, [{"metric": "loss", "step": 3, "value": 1.0, "time": soon}]).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_point_from_year_9999_over_grpc(channel: grpc.Channel) -> None:  # noqa: F811
    work_unit = factories.work_unit(experiment_for("alice@example.com"), wid=1)
    fresh_write_buckets(work_unit)
    write = channel.unary_unary("/xmc.metrics.v1.MetricsService/WriteMetrics",
                                request_serializer=metrics_pb2.WriteMetricsRequest.SerializeToString,
                                response_deserializer=metrics_pb2.WriteMetricsResponse.FromString)
    point = metrics_pb2.MetricPoint(metric="loss", step=1, value=1.0)
    point.time.FromDatetime(datetime(9999, 12, 31, 23, 59, tzinfo=timezone.utc))
    with pytest.raises(grpc.RpcError) as info:
        write(metrics_pb2.WriteMetricsRequest(parent=f"experiments/{work_unit.experiment_id}/workUnits/1",
                                              points=[point]),
              metadata=[("authorization", f"Bearer {tokens.token_for(work_unit.experiment_id, 1, 1)}")])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "points[0].time" in str(info.value.details())
    assert MetricPoint.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_it_stores_the_points_of_the_shipped_writer_on_a_clock_far_ahead_at_the_servers_time(
    live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    work_unit = factories.work_unit(experiment_for("alice@example.com"), wid=1)
    fresh_write_buckets(work_unit)

    class AheadClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + timedelta(days=3650)

    monkeypatch.setattr(xmc_metrics, "datetime", AheadClock)  # the job's clock only, not the server's
    writer = xmc_metrics.Writer(live_server.url, work_unit.experiment_id, 1, 1,
                                tokens.token_for(work_unit.experiment_id, 1, 1), flush_interval_s=60)
    writer.log(1, loss=0.5)
    writer.close()
    assert writer.written == 1 and writer.dropped == 0
    stored = MetricPoint.objects.get()
    assert abs((stored.time - dj_timezone.now()).total_seconds()) < 120


def _blocks(execution: int) -> set[tuple[Any, ...]]:
    return {(b.metric, b.size, b.block, b.count, b.min, b.max, b.last_step, b.last_time, round(b.sum, 6))
            for b in PointBlock.objects.filter(execution_id=execution, size__in=(16, 32, BLOCK_SIZES[-1]))}


@pytest.mark.django_db
def test_it_deletes_in_maintenance_future_points_stored_before_the_bound(unit: WorkUnit, settings: Any) -> None:
    execution = WorkUnitExecution.objects.get(work_unit=unit, eid=1).pk
    now = dj_timezone.now()
    far = datetime(9000, 6, 1, tzinfo=timezone.utc)
    # Stored as the old write path stored them: the same steps' blocks hold good and future points.
    services.write_points(execution, [services.Point("loss", s, float(s), now - timedelta(minutes=s))
                                      for s in range(10)])
    services.write_points(execution, [services.Point("loss", 10, 99.0, far),
                                      services.Point("acc", 1, 1.0, far)])
    with connection.cursor() as cursor:  # a far day's partition, as migration 0002 made for old points
        cursor.execute(f"SELECT to_regclass('{partitions.partition_name(far.date())}')")
        if cursor.fetchone()[0] is None:
            partitions.create_day(cursor, far.date())
    settings.XMC_METRICS_RETENTION_DAYS = 90
    done = tasks.maintain_partitions.apply().get()
    assert done["future_deleted"] == 2
    assert sorted(MetricPoint.objects.values_list("metric", "step")) == [("loss", s) for s in range(10)]
    # The blocks say what the points left say (no 99.0, no far time), and none is dated far ahead.
    assert PointBlock.objects.filter(last_time__gt=now + timedelta(days=1)).count() == 0
    assert {b[:7] for b in _blocks(execution)} == {("loss", size, 0, 10, 0.0, 9.0, 9)
                                                    for size in (16, 32, BLOCK_SIZES[-1])}
    span = PointSpan.objects.get(execution_id=execution)
    assert span.last_time <= now and span.first_time == now - timedelta(minutes=9)
    assert far.date() not in partitions.existing_days()


@pytest.mark.parametrize("point", [
    {"metric": "loss", "step": 1, "value": 1.0, "time": "2026-01-02T03:04:05\u0000Z"},
    {"metric": "lo\u0000ss", "step": 1, "value": 1.0},
    {"metric": "loss", "step": 1, "value": 1.0, "label\u0000": 1},
])
def test_it_refuses_a_nul_anywhere_in_a_metrics_write_as_nul(unit: WorkUnit, point: dict[str, Any]) -> None:
    """The orjson fast path took ``\\u0000`` into strings that every other JSON body refuses by name."""
    response = _post(unit, [point])
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and "NUL" in error["message"], error
    assert MetricPoint.objects.count() == 0
