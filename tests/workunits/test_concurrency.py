"""Concurrent writers on real Postgres: no deadlock, no lost update, invariants hold.

Several threads, each with its own database connection, hammer the same work
units (across two experiments, so batches lock rows of both) with
conflicting reconciler batches, stops, restarts and creates.
"""
from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from django.db import connection, connections
from django.utils import timezone

from core import convert
from core.errors import FailedPrecondition
from experiments.models import Experiment
from tests import factories
from workunits import services, state
from workunits.choices import TERMINAL, WorkUnitState
from workunits.models import Operation, StatusHistory, WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db(transaction=True)

S = WorkUnitState
STATES = [S.SCHEDULING, S.STARTING, S.RUNNING, S.PARTIALLY_FAILED, S.COMPLETED, S.FAILED, S.STOPPED]


def run_threads(target, n: int) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a writer hung (deadlock?)"
    return errors


def test_it_survives_conflicting_writers_without_deadlock_or_lost_update() -> None:
    exps = [factories.experiment(), factories.experiment()]
    keys = [(exp.id, factories.work_unit(exp).wid) for exp in exps for _ in range(3)]
    accepted: list[services.Transition] = []
    lock = threading.Lock()
    base = convert.ns_from_datetime(timezone.now()) + 10**12

    def writer(i: int) -> None:
        rng = random.Random(i)
        for step in range(40):
            choice = rng.random()
            if choice < 0.6:
                batch = []
                for xid, wid in rng.sample(keys, k=4):  # random order: the service sorts its locks
                    wu = WorkUnit.objects.get(experiment_id=xid, wid=wid)
                    batch.append(ExecutionUpdate(
                        xid=xid, wid=wid, eid=max(1, wu.current_eid - rng.choice([0, 0, 0, 1])), mask=(state.STATE,),
                        state=rng.choice(STATES), state_update_time_ns=base + step * 1000 + rng.randint(0, 999),
                    ))
                result = services.update_work_unit_executions(batch)
                with lock:
                    accepted.extend(result)
            elif choice < 0.75:
                xid, wid = rng.choice(keys)
                try:
                    services.stop_work_units(xid, [wid], batch=False)
                except FailedPrecondition:
                    pass
            elif choice < 0.9:
                xid, wid = rng.choice(keys)
                services.restart_work_units(xid, [wid], batch=False)
            else:
                xid = rng.choice(exps).id
                services.restart_work_units(xid, None, batch=True)

    errors = run_threads(writer, 4)
    assert errors == []

    for exp in exps:
        active = WorkUnitExecution.objects.filter(work_unit__experiment=exp, execution_state="ACTIVE")
        # Exactly one ACTIVE execution per work unit, the current one.
        for wu in WorkUnit.objects.filter(experiment=exp):
            assert list(active.filter(work_unit=wu).values_list("eid", flat=True)) == [wu.current_eid]
        # The roll-up saw every change (no lost counter update).
        real = Counter(active.values_list("state", flat=True))
        assert Experiment.objects.get(id=exp.id).child_state_counts == dict(real)
    # Every transition a writer was told about is in the history exactly once,
    # and nothing else changed a state behind the history's back.
    reconciler_history = StatusHistory.objects.filter(writer="reconciler").exclude(from_state="")
    assert reconciler_history.count() == len(accepted)
    # Every history row names an execution that exists (the code keeps what
    # the dropped FOREIGN KEY constraint used to).
    assert not StatusHistory.objects.exclude(execution_id__in=WorkUnitExecution.objects.values("id")).exists()
    # Executions in a terminal state never left it: their last history row is terminal.
    for ex in WorkUnitExecution.objects.all():
        rows = list(StatusHistory.objects.filter(execution=ex).order_by("id").values_list("to_state", flat=True))
        assert rows[-1] == ex.state
        first_terminal = next((k for k, s in enumerate(rows) if s in TERMINAL), None)
        if first_terminal is not None:
            assert rows[first_terminal:] == [rows[first_terminal]]


def test_it_creates_one_work_unit_for_the_same_id_from_two_threads_at_once() -> None:
    exp = factories.experiment()
    barrier = threading.Barrier(2)
    ops: list[int] = []

    def create(i: int) -> None:
        barrier.wait()
        op = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=7)
        ops.append(op.id)

    assert run_threads(create, 2) == []
    assert len(set(ops)) == 1
    assert WorkUnit.objects.filter(experiment=exp).count() == 1
    assert WorkUnitExecution.objects.filter(work_unit__experiment=exp).count() == 1
    assert Operation.objects.filter(experiment=exp).count() == 1
    assert connection.vendor == "postgresql"
