"""The set-based write path gives exactly what the old ORM path gave.

Twin data sets (same experiments, work units and executions, different ids)
receive the same random history: batches of masked updates from every
writer (fenced, stale, zero-time, re-sent and forced messages, several
updates of one work unit in a batch, work units that do not exist) mixed
with stops, restarts and launch-state changes. One twin goes through
``workunits.services.update_work_unit_executions``, the other through the
old ORM path kept in ``tests/workunits/oracle_update.py``. After every step
the executions, history, messages, experiment roll-ups and returned
transitions must be identical (ids mapped between the twins).
"""
from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import convert, pb
from core.errors import FailedPrecondition
from experiments import services as experiment_services
from experiments.models import Experiment
from tests import factories
from tests.workunits import oracle_update
from workunits import services, state
from workunits.choices import TERMINAL, WorkUnitState, Writer
from workunits.models import StatusHistory, StatusMessage, WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db

EXPERIMENTS = 2
WORK_UNITS = 3
STATES = list(WorkUnitState.values)
WRITERS = list(Writer.values)
TEXTS = ["pull failed", "OOMKilled", "slow start", "queue position 3"]


class Twin:
    """One of the two identical data sets, addressed by (experiment index, wid)."""

    def __init__(self, created: datetime) -> None:
        self.experiments = [
            experiment_services.create_experiment(pb.experiment.Experiment(), creator=factories.ALICE, now=created)
            for _ in range(EXPERIMENTS)
        ]
        self.work_units = {
            (i, services.create_work_unit(exp.id, factories.work_unit_message(), now=created).work_unit.wid): None
            for i, exp in enumerate(self.experiments) for _ in range(WORK_UNITS)
        }
        self.xids = [exp.id for exp in self.experiments]
        self.index = {xid: i for i, xid in enumerate(self.xids)}

    def current_eid(self, i: int, wid: int) -> int:
        return WorkUnit.objects.get(experiment_id=self.xids[i], wid=wid).current_eid

    def resolve(self, update: dict[str, Any]) -> ExecutionUpdate:
        """The update of the abstract history for this twin's ids."""
        fields = dict(update)
        i = fields.pop("experiment")
        eid_delta = fields.pop("eid_delta")
        wid = fields["wid"]
        exists = (i, wid) in self.work_units
        eid = (self.current_eid(i, wid) if exists else 1) + eid_delta
        return ExecutionUpdate(xid=self.xids[i], eid=max(eid, 1), **fields)

    def mapped_transitions(self, transitions: list[services.Transition]) -> list[tuple]:
        return [(self.index[t.xid], t.wid, t.eid, t.old_state, t.new_state) for t in transitions]

    def snapshot(self) -> dict[str, Any]:
        executions = []
        for ex in WorkUnitExecution.objects.filter(work_unit__experiment_id__in=self.xids).select_related(
            "work_unit"
        ).order_by("work_unit__experiment_id", "work_unit__wid", "eid"):
            metadata = dict(ex.metadata)
            metadata.pop("resourceName", None)  # names the xid
            executions.append((
                self.index[ex.work_unit.experiment_id], ex.work_unit.wid, ex.eid, ex.execution_state, ex.state,
                ex.state_update_time_ns, ex.system_message, ex.user_message, ex.scheduling_information,
                ex.detailed_status, metadata, ex.complete_time, ex.update_time,
            ))
        history = [
            (self.index[h.execution.work_unit.experiment_id], h.execution.work_unit.wid, h.execution.eid, h.time,
             h.from_state, h.to_state, h.writer, h.operation is not None and h.operation.action_type,
             h.request_id, h.extra)
            for h in StatusHistory.objects.filter(execution__work_unit__experiment_id__in=self.xids)
            .select_related("execution__work_unit", "operation").order_by("id")
        ]
        messages = [
            (self.index[m.experiment_id], m.work_unit.wid if m.work_unit else None, m.execution_id, m.content,
             m.severity, m.source, m.kind, m.create_time)
            for m in StatusMessage.objects.filter(experiment_id__in=self.xids).select_related("work_unit")
            .order_by("id")
        ]
        experiments = [
            (e.child_state_counts, e.message_severity_counts, e.active_state, e.launch_state, e.complete_time,
             e.last_child_status_update_time, e.status_update_time)
            for e in Experiment.objects.filter(id__in=self.xids).order_by("id")
        ]
        return {"executions": executions, "history": history, "messages": messages, "experiments": experiments}


def random_message(rng: random.Random) -> dict[str, Any] | None:
    if rng.random() < 0.15:
        return None
    message: dict[str, Any] = {
        "severity": rng.choice(["INFO", "WARNING", "ERROR", "SEVERITY_UNSPECIFIED"]),
        "userFacingText": rng.choice(TEXTS),
    }
    if rng.random() < 0.5:
        message["source"] = rng.choice(["KUBERNETES", "XMANAGER_BACKEND"])
    if rng.random() < 0.1:
        message["createTime"] = "2026-01-01T00:00:00Z"
    return message


def random_update(rng: random.Random, clock: int) -> dict[str, Any]:
    mask = tuple(rng.sample(sorted(state.MASK_PATHS), rng.randint(1, 3)))
    update: dict[str, Any] = {
        "experiment": rng.randrange(EXPERIMENTS),
        "wid": rng.choice([1, 2, 3, 3, 2, 1, 99]),  # 99 does not exist
        "eid_delta": rng.choice([0, 0, 0, 0, 0, 0, -1, 1]),  # fenced now and then
        "mask": mask,
        "writer": rng.choice(WRITERS),
        "request_id": rng.choice(["", "obs-1", "obs-2"]),
        "force_status_message_update": rng.random() < 0.2,
    }
    if state.STATE in mask:
        update["state"] = rng.choice(STATES)
        update["state_update_time_ns"] = rng.choice([0, clock - 5_000_000_000, clock, clock, clock + 1])
    if state.SYSTEM_MESSAGE in mask:
        update["system_message"] = random_message(rng)
    if state.USER_MESSAGE in mask:
        update["user_message"] = random_message(rng)
    if state.SCHEDULING_INFORMATION in mask:
        update["scheduling_information"] = random_message(rng)
    if state.DETAILED_STATUS in mask:
        update["detailed_status"] = rng.choice([None, {"jobsetStatus": {"restarts": str(rng.randint(0, 2))}}])
    if state.MLRUN_URL in mask:
        update["mlrun_url"] = rng.choice(["", "https://console.example/runs/r1", "https://console.example/runs/r2"])
    if rng.random() < 0.2:
        update["extra"] = {"rule": rng.randint(1, 8)}
    return update


def apply_step(twin: Twin, step: tuple, now: datetime, write) -> list[tuple]:
    kind = step[0]
    if kind == "batch":
        return twin.mapped_transitions(write([twin.resolve(u) for u in step[1]], now=now))
    i, wid = step[1], step[2]
    xid = twin.xids[i]
    if kind == "stop":
        try:
            services.stop_work_units(xid, [wid], batch=False, now=now)
        except FailedPrecondition:
            return [("stop refused",)]
    elif kind == "restart":
        services.restart_work_units(xid, [wid], batch=False, now=now)
    elif kind == "launched":
        experiment_services.update_launch_state(xid, pb.status.ExperimentStatus.LaunchState.COMPLETED, now=now)
    return []


def random_history(seed: int, steps: int) -> list[tuple]:
    rng = random.Random(seed)
    clock = convert.ns_from_datetime(timezone.now()) + 10**12
    history = []
    for _ in range(steps):
        clock += rng.choice([1, 1_000, 2_000_000_000])
        roll = rng.random()
        if roll < 0.7:
            history.append(("batch", [random_update(rng, clock) for _ in range(rng.randint(1, 12))]))
        else:
            history.append((rng.choice(["stop", "restart", "launched"]), rng.randrange(EXPERIMENTS),
                            rng.randint(1, WORK_UNITS)))
    return history


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 20))
def test_it_writes_what_the_orm_path_wrote_on_random_histories(seed: int, steps: int) -> None:
    now = timezone.now()
    new, old = Twin(now), Twin(now)
    assert new.snapshot() == old.snapshot()
    for number, step in enumerate(random_history(seed, steps)):
        now = now + timedelta(milliseconds=1 + number)
        got = apply_step(new, step, now, services.update_work_unit_executions)
        expected = apply_step(old, step, now, oracle_update.update_work_unit_executions)
        assert got == expected, f"transitions differ at step {number}: {step}"
        assert new.snapshot() == old.snapshot(), f"state differs after step {number}: {step}"


def test_it_compares_something_that_changes() -> None:
    """The random histories reach terminal states, messages and restarts (the comparison is not vacuous)."""
    now = timezone.now()
    twin = Twin(now)
    for number, step in enumerate(random_history(7, 60)):
        apply_step(twin, step, now + timedelta(milliseconds=number + 1), services.update_work_unit_executions)
    snap = twin.snapshot()
    assert len(snap["history"]) > 2 * EXPERIMENTS * WORK_UNITS
    assert snap["messages"]
    assert any(row[4] in TERMINAL for row in snap["executions"])
    assert any(row[2] > 1 for row in snap["executions"])
