"""UpdateBatcher on real Postgres with the real guarded service."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError
from django.utils import timezone

from core import convert
from core.errors import InvalidArgument
from k8s_bridge.reconciler import metrics
from k8s_bridge.reconciler.batcher import UpdateBatcher
from tests import factories
from tests.k8s_bridge.reconciler.conftest import execution
from tests.waiting import eventually
from workunits import services, state
from workunits.choices import WorkUnitState
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState


def at(wu, st: str, seconds: float = 1.0, mask=(state.STATE,), **kw) -> ExecutionUpdate:
    t = convert.ns_from_datetime(timezone.now()) + int(seconds * 1e9)
    return ExecutionUpdate(xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid, mask=mask, state=st,
                           state_update_time_ns=t, **kw)


class Recorder:
    """The real service, recording each batch it is called with (and optionally failing first)."""

    def __init__(self, fail_times: int = 0, during=None) -> None:
        self.calls: list[list[ExecutionUpdate]] = []
        self.fail_times = fail_times
        self.during = during

    def __call__(self, updates):
        self.calls.append(list(updates))
        if self.during is not None:
            during, self.during = self.during, None
            during()
        if self.fail_times:
            self.fail_times -= 1
            raise OperationalError("server closed the connection unexpectedly")
        return services.update_work_unit_executions(updates)


def test_it_writes_only_the_latest_update_of_a_slot_in_one_call() -> None:
    exp = factories.experiment()
    a, b = factories.work_unit(exp), factories.work_unit(exp)
    write = Recorder()
    batcher = UpdateBatcher(write, flush_interval_s=60)
    batcher.put("jobset", at(a, S.SCHEDULING, 1))
    batcher.put("jobset", at(a, S.RUNNING, 2))
    batcher.put("jobset", at(b, S.STARTING, 1))
    assert batcher.flush()
    assert len(write.calls) == 1
    assert [(u.wid, u.state) for u in write.calls[0]] == [(a.wid, S.RUNNING), (b.wid, S.STARTING)]
    assert execution(a).state == S.RUNNING and execution(b).state == S.STARTING
    assert batcher.pending() == {}


def test_it_keeps_everything_when_a_flush_fails_and_writes_it_on_retry() -> None:
    wu = factories.work_unit(factories.experiment())
    write = Recorder(fail_times=1)
    batcher = UpdateBatcher(write, flush_interval_s=60)
    batcher.put("jobset", at(wu, S.RUNNING))
    failed_before = metrics.FLUSHES.labels("failed")._value.get()
    assert not batcher.flush()
    assert metrics.FLUSHES.labels("failed")._value.get() == failed_before + 1
    assert execution(wu).state == S.INITIALIZING
    assert list(batcher.pending()) == [(wu.experiment_id, wu.wid, "jobset")]
    assert batcher.flush()
    assert execution(wu).state == S.RUNNING


def test_it_keeps_a_newer_update_that_arrived_during_the_flush() -> None:
    wu = factories.work_unit(factories.experiment())
    batcher = UpdateBatcher(flush_interval_s=60)
    newer = at(wu, S.RUNNING, 5)
    write = Recorder(during=lambda: batcher.put("jobset", newer))
    batcher._write = write
    batcher.put("jobset", at(wu, S.STARTING, 1))
    assert batcher.flush()
    assert execution(wu).state == S.STARTING
    assert batcher.pending() == {(wu.experiment_id, wu.wid, "jobset"): newer}
    assert batcher.flush()
    assert execution(wu).state == S.RUNNING


def test_it_drops_a_poisoned_update_without_blocking_the_others() -> None:
    exp = factories.experiment()
    good = [factories.work_unit(exp) for _ in range(5)]
    bad = factories.work_unit(exp)
    write = Recorder()
    batcher = UpdateBatcher(write, flush_interval_s=60)
    for wu in good:
        batcher.put("jobset", at(wu, S.RUNNING))
    poison = ExecutionUpdate(xid=bad.experiment_id, wid=bad.wid, eid=1, mask=(state.STATE,), state=S.RUNNING,
                             state_update_time_ns=None)  # status.state without its time: InvalidArgument
    batcher.put("pods", poison)
    dropped = metrics.DROPPED._value.get()
    assert batcher.flush()
    assert [execution(wu).state for wu in good] == [S.RUNNING] * 5
    assert execution(bad).state == S.INITIALIZING
    assert metrics.DROPPED._value.get() == dropped + 1
    assert batcher.pending() == {}
    batcher.put("jobset", at(bad, S.RUNNING))  # and the slot is usable again
    assert batcher.flush() and execution(bad).state == S.RUNNING


def test_it_drains_what_is_pending_on_stop() -> None:
    wu = factories.work_unit(factories.experiment())
    batcher = UpdateBatcher(flush_interval_s=3600)
    batcher.start()
    batcher.put("jobset", at(wu, S.RUNNING))
    batcher.stop(drain=True)
    assert execution(wu).state == S.RUNNING
    assert batcher.pending() == {}


def test_it_flushes_on_its_own_by_interval_and_by_size() -> None:
    exp = factories.experiment()
    units = [factories.work_unit(exp) for _ in range(3)]
    write = Recorder()
    batcher = UpdateBatcher(write, flush_interval_s=3600, max_batch=3)
    batcher.start()
    try:
        for wu in units:
            batcher.put("jobset", at(wu, S.STARTING))
        eventually(lambda: all(execution(wu).state == S.STARTING for wu in units), timeout=30, what="size flush")
        assert len(write.calls) == 1 and len(write.calls[0]) == 3
    finally:
        batcher.stop(drain=False)
    quick = UpdateBatcher(flush_interval_s=0.05)
    quick.start()
    try:
        quick.put("jobset", at(units[0], S.RUNNING, 2))
        eventually(lambda: execution(units[0]).state == S.RUNNING, timeout=30, what="interval flush")
    finally:
        quick.stop(drain=False)


def test_it_writes_nothing_without_the_lease() -> None:
    wu = factories.work_unit(factories.experiment())
    leading = threading.Event()
    batcher = UpdateBatcher(flush_interval_s=60, can_write=leading.is_set)
    batcher.put("jobset", at(wu, S.RUNNING))
    assert not batcher.flush()
    assert execution(wu).state == S.INITIALIZING
    batcher.discard()
    leading.set()
    assert batcher.flush() and execution(wu).state == S.INITIALIZING


def test_it_asks_again_each_interval_without_the_lease_not_in_a_busy_loop() -> None:
    wu = factories.work_unit(factories.experiment())
    asked = [0]

    def can_write() -> bool:
        asked[0] += 1
        return False

    batcher = UpdateBatcher(flush_interval_s=0.1, can_write=can_write)
    batcher.start()
    try:
        batcher.put("jobset", at(wu, S.RUNNING))
        time.sleep(1.0)
        assert 3 <= asked[0] <= 15  # about once per interval
    finally:
        batcher.stop(drain=False)
    assert execution(wu).state == S.INITIALIZING


def test_it_clears_queue_information_when_scheduling_and_running_meet_in_one_flush() -> None:
    wu = factories.work_unit(factories.experiment())
    batcher = UpdateBatcher(flush_interval_s=60)
    mask = (state.STATE, state.SCHEDULING_INFORMATION)
    info = {"severity": "INFO", "source": "SCHEDULER", "userFacingText": "Queued in cpu-queue (position 1 of 1)"}
    batcher.put("jobset", at(wu, S.SCHEDULING, 1, mask=mask, scheduling_information=info))
    assert batcher.flush() and execution(wu).scheduling_information["userFacingText"].startswith("Queued")
    batcher.put("jobset", at(wu, S.STARTING, 2, mask=mask, scheduling_information=None))
    batcher.put("jobset", at(wu, S.SCHEDULING, 3, mask=mask, scheduling_information=info))
    assert batcher.flush() and execution(wu).scheduling_information is not None
    batcher.put("jobset", at(wu, S.SCHEDULING, 4, mask=mask, scheduling_information=info))
    batcher.put("jobset", at(wu, S.RUNNING, 5, mask=mask, scheduling_information=None))
    assert batcher.flush()
    ex = execution(wu)
    assert ex.state == S.RUNNING and ex.scheduling_information is None


@pytest.mark.parametrize("order", ["workload_first", "jobset_first"])
def test_it_never_lets_a_queue_position_survive_the_move_out_of_scheduling_in_one_flush(order: str) -> None:
    """The Workload's observation (queue position, information only) and the JobSet's move
    to STARTING land in the same flush, put in either order: the position must not stay."""
    wu = factories.work_unit(factories.experiment())
    batcher = UpdateBatcher(flush_interval_s=60)
    info = {"severity": "INFO", "source": "SCHEDULER", "userFacingText": "Queued in cpu-queue (position 2 of 3)"}
    batcher.put("jobset", at(wu, S.SCHEDULING, 1, mask=(state.STATE, state.SCHEDULING_INFORMATION),
                             scheduling_information=info))
    assert batcher.flush() and execution(wu).scheduling_information == info
    position = ExecutionUpdate(xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid,
                               mask=(state.SCHEDULING_INFORMATION,), scheduling_information=info)
    started = at(wu, S.STARTING, 2, mask=(state.STATE, state.SCHEDULING_INFORMATION), scheduling_information=None)
    puts = [("workload", position), ("jobset", started)]
    for source, update in (puts if order == "workload_first" else puts[::-1]):
        batcher.put(source, update)
    assert batcher.flush()
    ex = execution(wu)
    assert ex.state == S.STARTING and ex.scheduling_information is None


def test_it_leaves_no_position_on_a_running_execution_from_a_late_observation_of_scheduling() -> None:
    """An observation computed while SCHEDULING but written after a newer RUNNING one (its
    state is refused as older): its queue position is refused with it."""
    wu = factories.work_unit(factories.experiment())
    mask = (state.STATE, state.SCHEDULING_INFORMATION)
    info = {"severity": "INFO", "source": "SCHEDULER", "userFacingText": "Queued in cpu-queue (position 1 of 1)"}
    stale = at(wu, S.SCHEDULING, 1, mask=mask, scheduling_information=info)
    services.update_work_unit_executions([at(wu, S.RUNNING, 2, mask=mask, scheduling_information=None), stale])
    ex = execution(wu)
    assert ex.state == S.RUNNING and ex.scheduling_information is None
    services.update_work_unit_executions([stale])
    assert execution(wu).scheduling_information is None


def test_it_keeps_the_slots_of_a_failed_part_and_reports_the_committed_part_with_two_connections() -> None:
    from django.db import connection

    first, second = factories.experiment(), factories.experiment()
    a, b = factories.work_unit(first), factories.work_unit(second)
    broken = {second.id}
    connections_used: set[int] = set()

    def write(updates):
        connection.ensure_connection()
        connections_used.add(id(connection.connection))  # this thread's own connection
        if any(u.xid in broken for u in updates):
            raise OperationalError("server closed the connection unexpectedly")
        return services.update_work_unit_executions(updates)

    reported: list[list[tuple[int, str]]] = []
    batcher = UpdateBatcher(write, flush_interval_s=60, connections=2,
                            on_committed=lambda ts, us: reported.append([(t.wid, t.new_state) for t in ts]))
    try:
        batcher.put("jobset", at(a, S.RUNNING))
        batcher.put("jobset", at(b, S.RUNNING))
        assert not batcher.flush()  # one part failed ...
        assert len(connections_used) == 2  # ... each part on its own connection
        # ... but the other committed, was reported, and is settled: only b's slot waits.
        assert execution(a).state == S.RUNNING and execution(b).state != S.RUNNING
        assert reported == [[(a.wid, S.RUNNING)]]
        assert set(batcher.pending()) == {(second.id, b.wid, "jobset")}

        broken.clear()
        assert batcher.flush()
        assert execution(b).state == S.RUNNING
        assert reported == [[(a.wid, S.RUNNING)], [(b.wid, S.RUNNING)]]  # a is not reported twice
        assert batcher.pending() == {}
    finally:
        batcher.stop(drain=False)


def two_experiments_in_two_shards():
    """Work units of two experiments that a two-connection batcher keeps in different shards."""
    first = factories.experiment()
    second = factories.experiment()
    while second.id % 2 == first.id % 2:
        second = factories.experiment()
    return factories.work_unit(first), factories.work_unit(second)


def test_it_flushes_each_shard_on_its_own_and_never_twice_at_once() -> None:
    slow, quick = two_experiments_in_two_shards()
    release = threading.Event()
    calls: list[tuple[int, ...]] = []
    running: dict[int, int] = {slow.experiment_id: 0, quick.experiment_id: 0}
    overlapped: list[int] = []
    guard = threading.Lock()

    def write(updates):
        xids = {u.xid for u in updates}
        assert len(xids) == 1  # a shard's flush never mixes in the other shard's experiment
        (xid,) = xids
        with guard:
            calls.append((xid, *(u.wid for u in updates)))
            running[xid] += 1
            if running[xid] > 1:
                overlapped.append(xid)
        try:
            if xid == slow.experiment_id:
                assert release.wait(60)
            return services.update_work_unit_executions(updates)
        finally:
            with guard:
                running[xid] -= 1

    batcher = UpdateBatcher(write, flush_interval_s=0.05, connections=2)
    batcher.start()
    try:
        batcher.put("jobset", at(slow, S.STARTING, 1))
        eventually(lambda: (slow.experiment_id, slow.wid) in calls, timeout=30, what="the slow shard's flush")
        batcher.put("jobset", at(slow, S.RUNNING, 2))  # queued behind the running flush of its shard
        batcher.put("jobset", at(quick, S.RUNNING, 1))
        # The other shard is written while the slow one is still stuck in its first flush.
        eventually(lambda: execution(quick).state == S.RUNNING, timeout=30, what="the quick shard's flush")
        assert execution(slow).state == S.INITIALIZING
        assert [c for c in calls if c[0] == slow.experiment_id] == [(slow.experiment_id, slow.wid)]
        release.set()
        eventually(lambda: execution(slow).state == S.RUNNING, timeout=30, what="the slow shard's next flush")
        assert overlapped == []
    finally:
        release.set()
        batcher.stop(drain=False)


def test_it_settles_and_reports_once_what_committed_before_a_failure_in_the_same_flush() -> None:
    exp = factories.experiment()
    a, b = factories.work_unit(exp), factories.work_unit(exp)
    calls: list[list[int]] = []

    def write(updates):
        calls.append([u.wid for u in updates])
        if len(calls) == 1:
            raise InvalidArgument("one of these is bad")  # names none: the batch is bisected
        if len(calls) == 3:
            raise OperationalError("server closed the connection unexpectedly")  # b's half
        return services.update_work_unit_executions(updates)

    reported: list[list[int]] = []
    batcher = UpdateBatcher(write, flush_interval_s=60,
                            on_committed=lambda ts, us: reported.append([t.wid for t in ts]))
    batcher.put("jobset", at(a, S.RUNNING))
    batcher.put("jobset", at(b, S.RUNNING))
    assert not batcher.flush()
    assert calls == [[a.wid, b.wid], [a.wid], [b.wid]]
    assert execution(a).state == S.RUNNING and execution(b).state == S.INITIALIZING
    assert reported == [[a.wid]]
    assert set(batcher.pending()) == {(exp.id, b.wid, "jobset")}  # only b is retried
    assert batcher.flush()
    assert calls[-1] == [b.wid] and reported == [[a.wid], [b.wid]]


def test_it_runs_the_hooks_of_different_shards_one_at_a_time() -> None:
    first, second = two_experiments_in_two_shards()
    inside = [0]
    most = [0]
    guard = threading.Lock()

    def hook(transitions, updates):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.2)  # both shards commit at about the same time; their hooks would overlap here
        with guard:
            inside[0] -= 1

    batcher = UpdateBatcher(flush_interval_s=60, connections=2, on_committed=hook)
    try:
        batcher.put("jobset", at(first, S.RUNNING))
        batcher.put("jobset", at(second, S.RUNNING))
        assert batcher.flush()
        assert most[0] == 1
    finally:
        batcher.stop(drain=False)
