"""The system metrics' collector writes only the finest and the coarsest blocks (`metrics.models.EAGER_BLOCK_SIZES`);
the sizes between come from pending rows, rolled up by a periodic pass or by the chart read that needs them
first: a chart at any zoom sees every point written before it, and the blocks still sum up exactly the points."""
from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone as dj_timezone

from core import pb
from metrics import data, hooks, services, tasks
from metrics.models import BLOCK_SIZES, EAGER_BLOCK_SIZES, LAZY_BLOCK_SIZES, PendingBlock, PointBlock
from tests import factories
from tests.metrics.conftest import experiment_for
from tests.metrics.test_storage import _blocks_from_points
from workunits.models import WorkUnit, WorkUnitExecution

ALICE = "alice@example.com"
M = pb.dashboard


@pytest.fixture
def unit(db: None) -> WorkUnit:
    return factories.work_unit(experiment_for(ALICE), wid=1)


def _execution(unit: WorkUnit) -> int:
    return WorkUnitExecution.objects.get(work_unit=unit, eid=1).pk


def _blocks(execution: int, size: int) -> set[tuple[Any, ...]]:
    return {(b.metric, b.block, b.count, b.min, b.max, b.last_step, round(b.sum, 6))
            for b in PointBlock.objects.filter(execution_id=execution, size=size)}


def _expected(execution: int, size: int) -> set[tuple[Any, ...]]:
    return {(m, blk, c, lo, hi, last, float(total)) for m, blk, c, lo, hi, last, total in _blocks_from_points(execution, size)}


@pytest.mark.django_db
def test_it_has_the_collectors_blocks_sum_up_exactly_the_points_once_the_periodic_pass_rolled_them_up(unit: WorkUnit) -> None:
    execution = _execution(unit)
    rng = random.Random(11)
    now = dj_timezone.now()
    for cycle in range(10):
        steps = sorted(rng.sample(range(cycle * 700 - 3000, cycle * 700 - 2300), rng.randrange(1, 200)))
        batch = [services.Point(rng.choice(["system/a", "system/b"]), s, rng.uniform(0, 1), now + timedelta(seconds=s))
                 for s in steps]
        services.write_points_many([(execution, batch)])
        services.write_points_many([(execution, batch[: len(batch) // 2])])  # a replay adds nothing, pending too
    for size in EAGER_BLOCK_SIZES:  # written with the points
        assert _blocks(execution, size) == _expected(execution, size)
    assert PendingBlock.objects.filter(execution_id=execution).exists()
    assert not PointBlock.objects.filter(execution_id=execution, size=LAZY_BLOCK_SIZES[0]).exists()

    assert tasks.roll_up_blocks()["blocks"] > 0
    assert not PendingBlock.objects.exists()
    for size in BLOCK_SIZES:
        assert _blocks(execution, size) == _expected(execution, size)
    assert tasks.roll_up_blocks() == {"blocks": 0}  # nothing left: a second pass adds nothing


@pytest.mark.django_db
def test_it_shows_the_new_point_to_a_chart_at_a_coarse_zoom_right_after_a_collector_write(unit: WorkUnit) -> None:
    execution = _execution(unit)
    now = dj_timezone.now()
    services.write_points_many([(execution, [services.Point("system/gpu_utilization", s, 0.5, now + timedelta(seconds=s))
                                             for s in range(20_000)])])
    plot = M.PlotSpec(plot_id="p", type=M.SCATTER, data=M.DataSpec(metrics=["system/gpu_utilization"]))
    assert data.block_size(20_000, 100) in LAZY_BLOCK_SIZES
    (entry,) = data.plot_data(data.Scope(unit.experiment_id, 1), plot, 100)
    assert entry.scatter_series.points[-1].step == 19_999

    # One more cycle, and no periodic pass in between: the next read sees it at the same zoom.
    services.write_points_many([(execution, [services.Point("system/gpu_utilization", 20_100, 0.9,
                                                            now + timedelta(seconds=20_100))])])
    assert PendingBlock.objects.filter(execution_id=execution).exists()
    (entry,) = data.plot_data(data.Scope(unit.experiment_id, 1), plot, 100)
    last = entry.scatter_series.points[-1]
    assert (last.step, last.max_value) == (20_100, 0.9)
    assert not PendingBlock.objects.filter(execution_id=execution).exists()  # the read rolled its own up


@pytest.mark.django_db
def test_it_counts_every_collector_point_in_an_aggregate_across_work_units_at_a_coarse_zoom() -> None:
    exp = experiment_for(ALICE)
    now = dj_timezone.now()
    executions = [_execution(factories.work_unit(exp, wid=wid)) for wid in (1, 2)]
    services.write_points_many([(e, [services.Point("system/cpu_usage_cores", s, float(k + 1), now + timedelta(seconds=s))
                                     for s in range(5_000)]) for k, e in enumerate(executions)])
    plot = M.PlotSpec(plot_id="all", type=M.SCATTER, data=M.DataSpec(metrics=["system/cpu_usage_cores"]),
                      stats=M.StatSpec(aggregation=M.StatSpec.Aggregation.MEAN))
    entries = data.plot_data(data.Scope(exp.id, None), plot, 100)
    points = [p for entry in entries for p in entry.scatter_series.points]
    assert points and all(p.avg_value == pytest.approx(1.5) for p in points)
    assert points[-1].step == 4_999


@pytest.mark.django_db
def test_it_has_the_listeners_of_a_collector_write_ask_the_database_as_often_for_many_executions_as_for_one() -> None:
    """The collector writes for every running execution at once (1,000 in bench/system_metrics.py): the
    listeners of `metrics.hooks.written_hooks` (the studies' ring, the pages' live publisher) answer the
    whole write, so its queries do not grow with the executions."""
    exp = experiment_for(ALICE)
    now = dj_timezone.now()
    executions = [_execution(factories.work_unit(exp, wid=wid)) for wid in range(1, 8)]

    def queries(batch: list[int]) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert services.write_points_many([(e, [services.Point("system/cpu_usage_cores", 1, 1.0, now)])
                                               for e in batch]) == len(batch)
        return len(captured)

    assert hooks.written_hooks  # the apps' listeners are registered
    assert queries(executions[:1]) == queries(executions[1:])
