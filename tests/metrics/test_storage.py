"""The points table at volume: daily partitions ahead and by retention, points outside every
partition, idempotent writes under replay and concurrency, the blocks GetChartData reads."""
from __future__ import annotations

import json
import random
import threading
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest
import time_machine
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone as dj_timezone

from core import pb
from metrics import data, evaluate, partitions, services, tasks, tokens
from metrics.models import BLOCK_SIZES, MetricPoint, PointBlock
from tests import factories
from tests.metrics.conftest import experiment_for
from workunits.models import WorkUnit, WorkUnitExecution

ALICE = "alice@example.com"


@pytest.fixture
def unit(db: None) -> WorkUnit:
    return factories.work_unit(experiment_for(ALICE), wid=1)


def _execution(unit: WorkUnit) -> int:
    return WorkUnitExecution.objects.get(work_unit=unit, eid=1).pk


def _post(unit: WorkUnit, body: Any) -> Any:
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return Client().post(f"/v1/experiments/{unit.experiment_id}/workUnits/1/metrics:write", raw,
                         content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {tokens.token_for(unit.experiment_id, 1, 1)}")


def _where(step: int) -> str:
    """The partition the point of ``step`` is stored in."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {partitions.PARENT} WHERE step = %s", [step])
        return str(cursor.fetchone()[0])


def _day(when: datetime) -> date:
    return when.astimezone(timezone.utc).date()


def _create(*days: date) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        for day in days:
            partitions.create_day(cursor, day)


# --- Partitions ahead, retention ------------------------------------------------------------


@pytest.mark.django_db
def test_it_has_partitions_ahead_and_the_hourly_task_keeps_them_ahead(settings: Any) -> None:
    settings.XMC_METRICS_PARTITIONS_AHEAD_DAYS = 7
    entry = settings.CELERY_BEAT_SCHEDULE["metrics-partitions"]
    assert entry["task"] == tasks.maintain_partitions.name and entry["schedule"] == 3600.0
    tasks.maintain_partitions()  # the migration made them; a run on the same day adds what a new day needs
    today = _day(dj_timezone.now())
    assert {today + timedelta(days=d) for d in range(8)} <= set(partitions.existing_days())
    later = dj_timezone.now() + timedelta(days=10)
    with time_machine.travel(later):
        done = tasks.maintain_partitions()
        assert done["created"] == [partitions.partition_name(_day(later) + timedelta(days=d)) for d in range(8)]
        assert tasks.maintain_partitions()["created"] == []  # idempotent
    assert {_day(later) + timedelta(days=d) for d in range(8)} <= set(partitions.existing_days())


@pytest.mark.django_db
def test_it_drops_whole_old_partitions_by_retention_and_keeps_the_newer_ones(unit: WorkUnit, settings: Any) -> None:
    now = dj_timezone.now()
    ago = {d: now - timedelta(days=d) for d in (200, 100, 95, 89, 1)}
    _create(_day(ago[100]), _day(ago[95]), _day(ago[89]))
    steps = {100: 0, 95: 100, 89: 200, 1: 300, 200: 400}  # days ago -> step (a 16-step block each)
    services.write_points(_execution(unit), [services.Point("m", step, 1.0, ago[d]) for d, step in steps.items()])
    assert _where(400) == partitions.DEFAULT  # 200 days ago: no partition of its own
    settings.XMC_METRICS_RETENTION_DAYS = 0
    assert tasks.maintain_partitions()["dropped"] == []  # 0 keeps them for ever
    settings.XMC_METRICS_RETENTION_DAYS = 90
    done = tasks.maintain_partitions()
    assert done["dropped"] == [partitions.partition_name(_day(ago[100])), partitions.partition_name(_day(ago[95]))]
    assert done["default_deleted"] == 1
    assert sorted(MetricPoint.objects.values_list("step", flat=True)) == [200, 300]
    days = partitions.existing_days()
    assert _day(ago[89]) in days and _day(ago[95]) not in days and _day(now) in days
    # Blocks wholly older than the retention go too; one holding newer points stays whole.
    assert sorted(PointBlock.objects.filter(size=16).values_list("block", flat=True)) == [200 // 16, 300 // 16]
    assert PointBlock.objects.get(size=1024).count == 5
    assert tasks.maintain_partitions() == {"created": [], "dropped": [], "default_deleted": 0, "blocks_deleted": 0,
                                              "future_deleted": 0}


@pytest.mark.django_db
def test_it_accepts_a_point_outside_every_partition_and_moves_it_into_its_partition_later(unit: WorkUnit) -> None:
    # (Points far ahead are refused: tests/security/test_metric_times.py.)
    body = {"points": [{"metric": "m", "step": 1, "value": 1, "time": "1999-01-01T00:00:00Z"},
                       {"metric": "m", "step": 2, "value": 2, "time": "2001-06-01T12:00:00+02:00"},
                       {"metric": "m", "step": 3, "value": 3, "time": "1970-01-01T00:00:00Z"}]}
    response = _post(unit, body)
    assert response.status_code == 200, response.content
    assert response.json() == {"written": 3, "duplicates": 0}
    assert {_where(s) for s in (1, 2, 3)} == {partitions.DEFAULT}
    _create(date(2001, 6, 1))  # the default partition's points of that day move into it
    assert _where(2) == partitions.partition_name(date(2001, 6, 1)) and _where(1) == partitions.DEFAULT
    assert MetricPoint.objects.count() == 3
    assert _post(unit, body).json() == {"written": 0, "duplicates": 3}


# --- Idempotency ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_adds_nothing_for_a_replayed_batch_with_or_without_client_time(unit: WorkUnit) -> None:
    timed = {"points": [{"metric": "loss", "step": s, "value": s / 10, "time": "2026-12-01T10:00:00Z"}
                        for s in range(3)]}
    assert _post(unit, timed).json() == {"written": 3, "duplicates": 0}
    assert _post(unit, timed).json() == {"written": 0, "duplicates": 3}
    # Without a time each call stamps the server's clock: a replay days later lands in another
    # partition, and still adds nothing.
    untimed = {"points": [{"metric": "acc", "step": s, "value": s} for s in range(4)]}
    first_day = dj_timezone.now().replace(hour=12, minute=0)
    with time_machine.travel(first_day):
        assert _post(unit, untimed).json() == {"written": 4, "duplicates": 0}
    with time_machine.travel(first_day + timedelta(days=3)):
        assert _post(unit, untimed).json() == {"written": 0, "duplicates": 4}
        overlapping = {"points": [{"metric": "acc", "step": s, "value": -1} for s in range(2, 7)]}
        assert _post(unit, overlapping).json() == {"written": 3, "duplicates": 2}
    assert _where(0) != _where(6)  # the two days' points are in two partitions
    assert list(MetricPoint.objects.filter(metric="acc").order_by("step").values_list("step", "value")) == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, -1.0), (5, -1.0), (6, -1.0)]
    # A point repeated within a batch: the first one wins.
    again = {"points": [{"metric": "lr", "step": 1, "value": 1}, {"metric": "lr", "step": 1, "value": 2}]}
    assert _post(unit, again).json() == {"written": 1, "duplicates": 1}
    assert MetricPoint.objects.get(metric="lr").value == 1.0


def _concurrently(*writes: Any) -> list[int]:
    """Run each ``write`` (a callable returning a count) in its own thread and connection, all at once."""
    barrier = threading.Barrier(len(writes))
    results: list[int] = [0] * len(writes)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = writes[i]()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


@pytest.mark.django_db(transaction=True)
def test_it_stores_the_same_batch_once_from_two_concurrent_writers() -> None:
    exp = experiment_for(ALICE)
    for round_number in range(4):
        wu = factories.work_unit(exp, wid=round_number + 1)
        execution = _execution(wu)
        t1 = datetime.now(timezone.utc)
        t2 = t1 + timedelta(days=2)  # the second writer stamped its own clock (another partition)
        batch = [(f"m{i % 3}", i) for i in range(600)]
        # First writes of an execution (no span yet), then replays over existing points.
        for offset in (0, 300):
            one = [services.Point(m, s + offset, float(s), t1) for m, s in batch]
            two = [services.Point(m, s + offset, float(s), t2) for m, s in batch]
            results = _concurrently(lambda: services.write_points(execution, one),
                                    lambda: services.write_points(execution, two))
            assert sorted(results) == ([0, 600] if offset == 0 else [0, 300])
        stored = MetricPoint.objects.filter(execution_id=execution)
        assert stored.count() == 900
        assert stored.values("metric", "step").distinct().count() == 900
        assert sum(PointBlock.objects.filter(execution_id=execution, size=16).values_list("count", flat=True)) == 900


# --- Blocks ---------------------------------------------------------------------------------


def _blocks_from_points(execution: int, size: int) -> set[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT metric, floor(step::numeric / %s)::bigint, count(*), min(value), max(value), max(step), "
            f"round(sum(value)::numeric, 6) FROM {partitions.PARENT} WHERE execution_id = %s GROUP BY 1, 2",
            [size, execution])
        return {tuple(row) for row in cursor.fetchall()}


@pytest.mark.django_db
def test_it_has_blocks_that_sum_up_exactly_the_points_stored(unit: WorkUnit) -> None:
    execution = _execution(unit)
    rng = random.Random(7)
    now = dj_timezone.now()
    for _ in range(12):
        start = rng.randrange(-3000, 3000)
        points = [services.Point(rng.choice(["a", "b"]), start + rng.randrange(0, 700), rng.uniform(-5, 5),
                                 now + timedelta(seconds=rng.randrange(100)))
                  for _ in range(rng.randrange(1, 400))]
        services.write_points(execution, points)
        services.write_points(execution, points[: len(points) // 2])  # replays add nothing to the blocks
    for size in (16, 32, 1024, BLOCK_SIZES[-1]):
        blocks = {(b.metric, b.block, b.count, b.min, b.max, b.last_step, round(b.sum, 6))
                  for b in PointBlock.objects.filter(execution_id=execution, size=size)}
        assert blocks == {(m, blk, c, lo, hi, last, float(total))
                          for m, blk, c, lo, hi, last, total in _blocks_from_points(execution, size)}


@pytest.mark.django_db
def test_it_reads_a_long_series_in_blocks_one_per_bucket_and_bounded_by_the_width(unit: WorkUnit) -> None:
    execution = _execution(unit)
    now = dj_timezone.now()
    for start in range(0, 20_000, 5_000):
        services.write_points(execution, [services.Point("loss", s, float(s), now) for s in range(start, start + 5_000)])
    M = pb.dashboard
    plot = M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]))
    assert data.block_size(20_000, 100) == 256 and data.block_size(400, 100) is None
    (entry,) = data.plot_data(data.Scope(unit.experiment_id, 1), plot, 100)
    points = entry.scatter_series.points
    assert 50 <= len(points) <= 100  # 20,000 points stored; one bucket a 256-step block
    for i, point in enumerate(points):
        low, high = 256 * i, min(256 * i + 255, 19_999)
        assert (point.min_value, point.max_value, point.step) == (low, high, high)
        assert point.avg_value == pytest.approx((low + high) / 2)
    # With a data range the points themselves are bucketed (a block may straddle the range's end).
    ranged = M.PlotSpec(plot_id="r", type=M.SCATTER, data=M.DataSpec(
        metrics=["loss"], ranges=[M.DataSpec.DataRange(start_step=100, end_step=10_099)]))
    (entry,) = data.plot_data(data.Scope(unit.experiment_id, 1), ranged, 100)
    points = entry.scatter_series.points
    assert len(points) == 100 and points[0].min_value == 100 and points[-1].max_value == 10_099


def test_it_shares_a_budget_of_buckets_per_pixel_among_many_series() -> None:
    # An overlay of 100 units x 10,000 steps at 1,000 px: 313 blocks of 32 steps a series, not 625 of 16.
    assert data.series_width(1000, 1) == data.series_width(1000, 32) == 1000
    assert data.series_width(1000, 100) == 320 and data.block_size(10_000, data.series_width(1000, 100)) == 32
    assert data.series_width(1000, 100_000) == data.MIN_SERIES_WIDTH and data.series_width(60, 1000) == 60


@pytest.mark.django_db
def test_it_reads_each_unit_of_an_overlay_of_many_in_fewer_blocks_within_the_budget() -> None:
    exp = experiment_for(ALICE)
    now = dj_timezone.now()
    for wid in range(1, 41):
        execution = _execution(factories.work_unit(exp, wid=wid))
        services.write_points(execution, [services.Point("loss", s, float(s + wid), now) for s in range(4_000)])
    M = pb.dashboard
    plot = M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]))
    assert data.block_size(4_000, 250) == 16  # one series alone: 250 blocks of 16 steps
    entries = data.plot_data(data.Scope(exp.id, None), plot, 250)
    assert len(entries) == 40 and data.series_width(250, 40) == 200
    for entry in entries:  # 40 series: 125 blocks of 32 steps each, every one a true bucket
        points = entry.scatter_series.points
        wid = int(entry.scatter_series.work_unit_id)
        assert len(points) == 125
        assert (points[0].min_value, points[0].max_value, points[-1].step) == (wid, 31 + wid, 3_999)
    assert sum(len(e.scatter_series.points) for e in entries) <= data.SERIES_BUDGET * 250


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["MEAN", "MEDIAN", "MIN", "MAX", "SUM", "MEAN_CI_95"])
def test_it_computes_an_aggregate_over_blocks_in_sql_as_evaluate_computes_it(how: str) -> None:
    exp = experiment_for(ALICE)
    now = dj_timezone.now()
    for wid in (1, 2, 3):
        execution = _execution(factories.work_unit(exp, wid=wid))
        services.write_points(execution, [services.Point("loss", s, (s % 97) * wid / 10, now) for s in range(2_000)])
    M = pb.dashboard
    S = M.StatSpec
    each = M.PlotSpec(plot_id="each", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]))
    across = M.PlotSpec(plot_id="all", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                        stats=M.StatSpec(aggregation=S.Aggregation.Value(how)))
    scope = data.Scope(exp.id, None)
    series, aggregated = data._series(scope, across, 100, how)
    assert not series and len(aggregated["loss"]) == 63  # 2,000 steps in 32-step blocks, one SQL series
    (entry,) = data.plot_data(scope, across, 100)
    per_unit = [columns.buckets() for columns in data._series(scope, each, 100)[0].values()]
    expected = evaluate.aggregate(per_unit, how)
    got = [v for p in entry.scatter_series.points for v in (p.step, p.avg_value, p.min_value, p.max_value)]
    assert got == pytest.approx([v for b in expected for v in (b.step, b.avg, b.min, b.max)])
