"""The integrity the dropped StatusHistory.execution FOREIGN KEY gave, now kept by the code.

Migration 0002 removed the database constraint (the per-row check doubled
the cost of a history insert; the index stays). These tests hold the code to
what the constraint guaranteed: no history row ever names an execution that
does not exist — not after writes (valid, fenced, for missing work units),
not after restarts, not after deletes through the ORM.
"""
from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from core import convert
from experiments.models import Experiment
from tests import factories
from workunits import services, state
from workunits.models import StatusHistory, WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db


def orphans() -> int:
    return StatusHistory.objects.exclude(execution_id__in=WorkUnitExecution.objects.values("id")).count()


def at(wu, st: str, eid: int | None = None) -> ExecutionUpdate:
    return ExecutionUpdate(xid=wu.experiment_id, wid=wu.wid, eid=eid or wu.current_eid, mask=(state.STATE,),
                           state=st, state_update_time_ns=convert.ns_from_datetime(timezone.now()) + 10**9)


def test_it_no_longer_has_the_database_check_the_history_execution() -> None:
    # Why the tests below exist: the database accepts a dangling execution id.
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {StatusHistory._meta.db_table} (execution_id, time, from_state, to_state, writer, "
            "request_id, extra) VALUES (%s, now(), '', 'RUNNING', 'reconciler', '', '{}')", [10**15])
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # a deferred constraint would fail here
    assert orphans() == 1


def test_it_writes_history_only_for_executions_that_exist() -> None:
    exp = factories.experiment()
    wu1, wu2 = factories.work_unit(exp), factories.work_unit(exp)
    services.restart_work_units(exp.id, [wu2.wid], batch=False)
    wu2.refresh_from_db()
    ghost = ExecutionUpdate(xid=exp.id, wid=99, eid=1, mask=(state.STATE,), state="RUNNING",
                            state_update_time_ns=convert.ns_from_datetime(timezone.now()))
    services.update_work_unit_executions([at(wu1, "RUNNING"), at(wu2, "RUNNING", eid=1), ghost,
                                          at(wu2, "SCHEDULING"), at(wu2, "RUNNING", eid=3)])
    services.stop_work_units(exp.id, None, batch=True)

    assert StatusHistory.objects.filter(execution__work_unit__experiment=exp).count() == 7
    assert orphans() == 0
    # Each row belongs to the execution the change happened to.
    assert list(StatusHistory.objects.filter(execution__work_unit=wu2).values_list("execution__eid", "to_state")
                .order_by("id")) == [(1, "INITIALIZING"), (2, "RESTARTING"), (2, "SCHEDULING"), (2, "STOPPING")]


def test_it_deletes_the_history_with_its_experiment_or_work_unit() -> None:
    exp, other = factories.experiment(), factories.experiment()
    wu = factories.work_unit(exp)
    kept = factories.work_unit(other)
    dropped = factories.work_unit(other)
    services.update_work_unit_executions([at(wu, "RUNNING"), at(kept, "RUNNING"), at(dropped, "RUNNING")])
    services.restart_work_units(exp.id, [wu.wid], batch=False)

    Experiment.objects.get(id=exp.id).delete()
    WorkUnit.objects.get(id=dropped.id).delete()

    assert orphans() == 0
    assert StatusHistory.objects.filter(execution__work_unit=kept).count() == 2
