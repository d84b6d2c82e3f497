"""Metric summaries kept at ingest: every write path keeps each (execution, metric)'s last value and
step, min, max, count and first/last time in the same statement as its points, whatever the order,
replays and restarts; the migration computes them for points written before."""
from __future__ import annotations

import importlib
import json
import random
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client

from metrics import services, tokens
from metrics.models import MetricSummary
from tests import factories
from tests.metrics.conftest import T0, experiment_for, stored_summaries, summaries_from_points
from workunits import services as wu_services
from workunits.models import WorkUnit, WorkUnitExecution

ALICE = "alice@example.com"


def _pk(unit: WorkUnit, eid: int = 1) -> int:
    return WorkUnitExecution.objects.get(work_unit=unit, eid=eid).pk


def _point(metric: str, step: int, value: float, seconds: float | None = None) -> services.Point:
    return services.Point(metric, step, value, T0 + timedelta(seconds=step if seconds is None else seconds))


@pytest.mark.django_db
def test_it_keeps_the_summary_of_each_metric_as_points_arrive() -> None:
    unit = factories.work_unit(experiment_for(ALICE), wid=1)
    execution = _pk(unit)
    services.write_points(execution, [_point("loss", s, 10.0 - s) for s in range(5)]
                          + [_point("acc", s, s / 10) for s in range(3)])
    summary = MetricSummary.objects.get(work_unit=unit, eid=1, metric="loss")
    assert (summary.last, summary.last_step, summary.min, summary.max, summary.count) == (6.0, 4, 6.0, 10.0, 5)
    assert (summary.first_time, summary.last_time) == (T0, T0 + timedelta(seconds=4))
    assert summary.experiment_id == unit.experiment_id
    # An older step arriving late changes min/max/count, never the last value.
    services.write_points(execution, [_point("loss", -3, 42.0, seconds=100), _point("loss", 2, 0.0)])
    summary.refresh_from_db()
    assert (summary.last, summary.last_step, summary.min, summary.max, summary.count) == (6.0, 4, 6.0, 42.0, 6)
    assert summary.last_time == T0 + timedelta(seconds=100)  # the point at step 2 is a duplicate: nothing
    # A replay adds nothing; a later step moves the last value.
    services.write_points(execution, [_point("loss", s, 10.0 - s) for s in range(5)])
    services.write_points(execution, [_point("loss", 9, 7.5)])
    summary.refresh_from_db()
    assert (summary.last, summary.last_step, summary.count) == (7.5, 9, 7)
    assert stored_summaries() == summaries_from_points()


@pytest.mark.django_db
def test_it_gives_a_restart_a_summary_of_its_own() -> None:
    unit = factories.work_unit(experiment_for(ALICE), wid=1)
    services.write_points(_pk(unit), [_point("loss", s, 1.0 + s) for s in range(3)])
    wu_services.restart_work_units(unit.experiment_id, [1], batch=False)
    services.write_points(_pk(unit, 2), [_point("loss", 0, 0.5)])
    rows = dict(MetricSummary.objects.filter(work_unit=unit).values_list("eid", "last"))
    assert rows == {1: 3.0, 2: 0.5}
    assert stored_summaries() == summaries_from_points()


@pytest.mark.django_db
def test_it_leaves_the_summaries_the_points_say_after_random_batches() -> None:
    exp = experiment_for(ALICE)
    units = [factories.work_unit(exp, wid=w) for w in (1, 2, 3)]
    rng = random.Random(37)
    for _ in range(40):
        unit = rng.choice(units)
        batch = [_point(rng.choice(["loss", "acc", "val/loss"]), rng.randint(-5, 60), rng.uniform(-1e3, 1e3),
                        seconds=rng.uniform(0, 1e5)) for _ in range(rng.randint(1, 30))]
        services.write_points(_pk(unit), batch)
    assert len(stored_summaries()) >= 6
    assert stored_summaries() == summaries_from_points()


@pytest.mark.django_db
def test_it_keeps_the_summaries_on_the_http_write_path() -> None:
    unit = factories.work_unit(experiment_for(ALICE), wid=1)
    body = {"points": [{"metric": "loss", "step": s, "value": 1 / (s + 1)} for s in range(4)]}
    answer = Client().post(f"/v1/experiments/{unit.experiment_id}/workUnits/1/metrics:write", json.dumps(body),
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {tokens.token_for(unit.experiment_id, 1, 1)}")
    assert answer.status_code == 200, answer.content
    assert MetricSummary.objects.get(work_unit=unit, metric="loss").last == 0.25
    assert stored_summaries() == summaries_from_points()


@pytest.mark.django_db
def test_it_leaves_no_summary_after_a_rolled_back_write() -> None:
    unit = factories.work_unit(experiment_for(ALICE), wid=1)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.write_points(_pk(unit), [_point("loss", 1, 1.0)])
        raise RuntimeError("the caller's transaction fails after the write")
    assert not MetricSummary.objects.exists()


@pytest.mark.django_db
def test_it_computes_in_the_migration_the_summaries_of_points_written_before_it() -> None:
    exp = experiment_for(ALICE)
    for wid in (1, 2):
        unit = factories.work_unit(exp, wid=wid)
        services.write_points(_pk(unit), [_point(m, s, random.uniform(0, 1)) for m in ("a", "b") for s in range(7)])
    expected = stored_summaries()
    MetricSummary.objects.all().delete()
    migration: Any = importlib.import_module("metrics.migrations.0003_metric_summaries")
    with connection.cursor() as cursor:
        cursor.execute(migration.BACKFILL)
    assert stored_summaries() == expected == summaries_from_points()
