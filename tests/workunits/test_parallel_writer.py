"""workunits.writers: a batch split by experiment over several real connections."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from core import convert
from experiments.models import Experiment
from tests import factories
from workunits import services, state
from workunits.models import WorkUnitExecution
from workunits.state import ExecutionUpdate
from workunits.writers import ParallelWriter, split_by_experiment, update_work_unit_executions_parallel

pytestmark = pytest.mark.django_db(transaction=True)


def update(xid: int, wid: int, st: str, t: int) -> ExecutionUpdate:
    return ExecutionUpdate(xid=xid, wid=wid, eid=1, mask=(state.STATE,), state=st, state_update_time_ns=t)


def test_it_keeps_each_experiments_updates_together_and_in_order() -> None:
    updates = [update(x, w, "RUNNING", i) for i, (x, w) in enumerate(
        [(1, 1), (2, 1), (1, 2), (3, 1), (2, 2), (1, 1), (4, 1)])]
    parts = split_by_experiment(updates, 2)
    assert len(parts) == 2
    assert sorted(u.state_update_time_ns for part in parts for u in part) == list(range(len(updates)))
    for part in parts:
        for xid in {u.xid for u in part}:
            times = [u.state_update_time_ns for u in part if u.xid == xid]
            assert times == sorted(times)  # batch order within an experiment
    owners = {u.xid: i for i, part in enumerate(parts) for u in part}
    assert all(owners[u.xid] == i for i, part in enumerate(parts) for u in part)  # one part per experiment
    assert split_by_experiment(updates, 8) == [[u for u in updates if u.xid == x] for x in (1, 2, 3, 4)]


def test_it_writes_every_update_through_two_connections() -> None:
    exps = [factories.experiment() for _ in range(4)]
    wus = [factories.work_unit(exp) for exp in exps for _ in range(3)]
    t = convert.ns_from_datetime(timezone.now()) + 10**9
    updates = [update(wu.experiment_id, wu.wid, "SCHEDULING", t) for wu in wus] + [
        update(wu.experiment_id, wu.wid, "RUNNING", t + 1) for wu in wus]

    result = update_work_unit_executions_parallel(updates, connections=2)

    assert result.ok
    assert sorted((tr.xid, tr.wid, tr.new_state) for tr in result.transitions) == sorted(
        (wu.experiment_id, wu.wid, s) for wu in wus for s in ("SCHEDULING", "RUNNING"))
    assert set(WorkUnitExecution.objects.values_list("state", flat=True)) == {"RUNNING"}
    for exp in exps:
        assert Experiment.objects.get(id=exp.id).child_state_counts == {"RUNNING": 3}


def test_it_commits_one_experiment_while_another_waits_for_its_locks() -> None:
    busy, free = factories.experiment(), factories.experiment()
    busy_wu, free_wu = factories.work_unit(busy), factories.work_unit(free)
    t = convert.ns_from_datetime(timezone.now()) + 10**9
    release = threading.Event()
    holding = threading.Event()

    def hold_busy_lock() -> None:
        try:
            with transaction.atomic():
                services.executions._lock_work_units([(busy.id, busy_wu.wid)])
                holding.set()
                release.wait(timeout=120)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_busy_lock)
    holder.start()
    assert holding.wait(timeout=60)
    with ParallelWriter(2) as writer:
        done: list = []
        flush = threading.Thread(target=lambda: done.append(writer.write(
            [update(busy.id, busy_wu.wid, "RUNNING", t), update(free.id, free_wu.wid, "RUNNING", t)])))
        flush.start()
        # The free experiment's part commits on its own connection while the busy one waits.
        deadline = time.monotonic() + 120
        while WorkUnitExecution.objects.get(work_unit_id=free_wu.id).state != "RUNNING":
            assert time.monotonic() < deadline, "the free experiment waited for the busy one"
            time.sleep(0.02)
        assert WorkUnitExecution.objects.get(work_unit_id=busy_wu.id).state == "INITIALIZING"
        release.set()
        flush.join(timeout=120)
        holder.join(timeout=120)
    assert done and done[0].ok
    assert WorkUnitExecution.objects.get(work_unit_id=busy_wu.id).state == "RUNNING"
    assert connection.vendor == "postgresql"


def test_it_reports_a_failed_part_and_commits_the_others() -> None:
    good_exp, bad_exp = factories.experiment(), factories.experiment()
    good, bad = factories.work_unit(good_exp), factories.work_unit(bad_exp)
    t = convert.ns_from_datetime(timezone.now()) + 10**9
    invalid = ExecutionUpdate(xid=bad_exp.id, wid=bad.wid, eid=1, mask=(state.STATE,), state="RUNNING",
                              state_update_time_ns=None)

    result = update_work_unit_executions_parallel(
        [update(good_exp.id, good.wid, "RUNNING", t), invalid, update(bad_exp.id, bad.wid, "STARTING", t)],
        connections=2,
    )

    assert not result.ok
    ((part, error),) = result.failed
    assert isinstance(error, services.InvalidUpdates) and error.keys == ((bad_exp.id, bad.wid, 1),)
    assert [u.xid for u in part] == [bad_exp.id, bad_exp.id]
    assert WorkUnitExecution.objects.get(work_unit_id=good.id).state == "RUNNING"
    assert WorkUnitExecution.objects.get(work_unit_id=bad.id).state == "INITIALIZING"


def test_it_writes_in_the_callers_connection_with_one_connection() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    with ParallelWriter(1) as writer:
        assert writer.write([update(exp.id, wu.wid, "RUNNING", convert.ns_from_datetime(timezone.now()))]).ok
    assert WorkUnitExecution.objects.get(work_unit_id=wu.id).state == "RUNNING"
    with pytest.raises(ValueError):
        ParallelWriter(0)
