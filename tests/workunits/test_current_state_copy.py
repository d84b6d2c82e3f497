"""A work unit's row carries its current execution's state and times (``WorkUnit.current_state``,
``current_start``, ``current_end``), written with every change of them: what the sweep table sorts
and filters 100,000 units by without reading an execution."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests import factories
from workunits import services
from workunits.models import WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db(transaction=True)


def _copy(unit: WorkUnit) -> tuple[str, object, object]:
    unit.refresh_from_db()
    return unit.current_state, unit.current_start, unit.current_end


def _current(unit: WorkUnit) -> tuple[str, object, object]:
    ex = WorkUnitExecution.objects.get(work_unit=unit, eid=unit.current_eid)
    return ex.state, ex.create_time, ex.complete_time


def _move(unit: WorkUnit, state: str, at: object, eid: int = 1, **kw: object) -> None:
    services.update_work_unit_executions(
        [ExecutionUpdate(xid=unit.experiment_id, wid=unit.wid, eid=eid, mask=("status.state",), state=state,
                         state_update_time_ns=int(at.timestamp() * 1e9), **kw)], now=at)  # type: ignore[attr-defined]


def test_it_reads_initializing_since_its_creation_for_a_new_work_unit() -> None:
    unit = factories.work_unit(factories.experiment())
    assert _copy(unit) == _current(unit) == ("INITIALIZING", unit.create_time, None)


def test_it_follows_every_state_change_and_ends_when_the_execution_does() -> None:
    unit = factories.work_unit(factories.experiment())
    at = timezone.now()
    for n, state in enumerate(("SCHEDULING", "RUNNING", "COMPLETED"), 1):
        _move(unit, state, at + timedelta(seconds=n))
        assert _copy(unit) == _current(unit)
    assert _copy(unit)[2] == at + timedelta(seconds=3)


def test_it_leaves_the_copy_as_the_execution_is_on_a_dropped_update() -> None:
    unit = factories.work_unit(factories.experiment())
    at = timezone.now()
    _move(unit, "RUNNING", at + timedelta(seconds=10))
    _move(unit, "SCHEDULING", at + timedelta(seconds=5))  # older than what is stored: dropped
    _move(unit, "RUNNING", at + timedelta(seconds=20), eid=7)  # not the current execution: fenced
    assert _copy(unit) == _current(unit) and _copy(unit)[0] == "RUNNING"


def test_it_starts_the_copy_again_from_the_new_execution_on_a_restart() -> None:
    unit = factories.work_unit(factories.experiment())
    at = timezone.now()
    _move(unit, "FAILED", at + timedelta(seconds=1))
    assert _copy(unit)[0] == "FAILED" and _copy(unit)[2] is not None
    services.restart_work_units(unit.experiment_id, [unit.wid], batch=False, now=at + timedelta(seconds=2))
    assert _copy(unit) == _current(unit) == ("RESTARTING", at + timedelta(seconds=2), None)
    _move(unit, "RUNNING", at + timedelta(seconds=3), eid=2)
    assert _copy(unit) == _current(unit)
