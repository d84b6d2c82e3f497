"""CreateWorkUnit writes exactly the rows the ORM inserts and roll-up save wrote, in two statements."""
from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.db.models import Model
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import convert, pb
from core.errors import FailedPrecondition
from tests import factories
from workunits import services
from workunits.choices import ActionType, ExecutionState, TaskType, Writer
from workunits.models import Operation, StatusHistory, WorkUnit, WorkUnitExecution

pytestmark = pytest.mark.django_db
SKIP = {"id", "experiment", "work_unit", "execution", "operation", "target"}


def _orm_oracle(exp: Any, message: Any, wid: int, now: datetime) -> tuple[Model, ...]:
    """The inserts as the ORM path made them (objects.create, one statement each)."""
    wu = WorkUnit.objects.create(
        experiment=exp, wid=wid, work_unit_type="STANDARD", priority=exp.priority, create_time=now, update_time=now,
        urls=[convert.to_json(u) for u in message.urls], executable=convert.to_json(message.executable),
        tags=list(message.tags), notes=message.notes, current_eid=1, current_start=now)
    op = Operation.objects.create(
        experiment=exp, work_unit=wu, action_type=ActionType.CREATE, target=wu.name, create_time=now,
        original_requester="alice@example.com", asserted_email="a@example.com", task_type=TaskType.CREATE, eid=1)
    ex = WorkUnitExecution.objects.create(
        work_unit=wu, eid=1, execution_state=ExecutionState.ACTIVE, create_time=now, update_time=now,
        state="INITIALIZING", state_update_time_ns=convert.ns_from_datetime(now),
        metadata=convert.to_json(pb.work_unit_execution.WorkUnitExecutionMetadata(
            type=pb.work_unit_execution.WorkUnitExecutionMetadata.WorkUnitExecutionType.JOB_SET,
            resource_name=f"xmc-{exp.id}-{wid}")))
    history = StatusHistory.objects.create(execution=ex, time=now, from_state="", to_state="INITIALIZING",
                                           writer=Writer.STATE_SERVER, operation=op, extra={"insert": True})
    return wu, op, ex, history


def _fields(obj: Model) -> dict[str, Any]:
    row = type(obj).objects.get(pk=obj.pk)
    return {f.name: getattr(row, f.attname) for f in type(obj)._meta.concrete_fields if f.name not in SKIP}


def test_it_writes_the_same_rows_as_the_orm_inserts() -> None:
    now = timezone.now()
    message = factories.work_unit_message()
    message.tags.extend(["x", "y"])
    message.notes = "notes"
    message.urls.add(url="http://u", display_name="u")
    ours, oracle = factories.experiment(), factories.experiment()
    op = services.create_work_unit(ours.id, message, work_unit_id=7,
                                   requester=services.Requester("alice@example.com", "a@example.com"), now=now)
    wu = WorkUnit.objects.get(experiment=ours, wid=7)
    ex = WorkUnitExecution.objects.get(work_unit=wu)
    history = StatusHistory.objects.get(execution=ex)
    assert (op.work_unit_id, history.operation_id) == (wu.id, op.id)
    assert op.target == wu.name and op.name == f"{wu.name}/operations/{op.id}"
    expected = _orm_oracle(oracle, message, 7, now)
    metadata = dict(expected[2].metadata, resourceName=f"xmc-{ours.id}-7")  # names its own experiment
    got = [_fields(o) for o in (wu, op, ex, history)]
    want = [_fields(o) for o in expected]
    want[2]["metadata"] = metadata
    assert got == want
    # The returned operation is a saved model, as objects.create returned it.
    assert not op._state.adding and Operation.objects.get(pk=op.pk).work_unit_id == op.work_unit.id


def _statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]


def test_it_creates_in_two_statements_with_or_without_an_id() -> None:
    exp = factories.experiment()
    with CaptureQueriesContext(connection) as allocated:
        services.create_work_unit(exp.id, factories.work_unit_message())
    with CaptureQueriesContext(connection) as with_id:
        services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=5)
    with CaptureQueriesContext(connection) as replayed:
        again = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=5)
    # The lock (reading any existing CREATE operation), then the insert chain with the roll-up.
    assert len(_statements(allocated)) == 2, _statements(allocated)
    assert len(_statements(with_id)) == 2, _statements(with_id)
    assert len(_statements(replayed)) == 2  # the lock, then the first call's operation
    assert again.work_unit.wid == 5


def test_it_rolls_up_as_apply_rollup_did() -> None:
    exp = factories.experiment()
    for _ in range(3):
        services.create_work_unit(exp.id, factories.work_unit_message())
    services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=9)
    exp.refresh_from_db()
    assert exp.child_state_counts == {"INITIALIZING": 4}
    assert exp.last_wid == 9
    assert exp.last_child_status_update_time == exp.status_update_time is not None
    assert services.create_work_unit(exp.id, factories.work_unit_message()).work_unit.wid == 10


def test_it_writes_no_second_work_unit_when_the_wid_exists_without_a_create_operation() -> None:
    exp = factories.experiment()
    services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    Operation.objects.filter(experiment=exp).delete()  # the client deleted the CREATE operation (DeleteOperation)
    op = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    # The insert did not half-happen, and the retry is answered with the existing work unit (issue: idempotent
    # CreateWorkUnit after DeleteOperation): one fresh operation, already done.
    assert WorkUnitExecution.objects.filter(work_unit__experiment=exp).count() == 1
    assert list(Operation.objects.filter(experiment=exp).values_list("id", "done")) == [(op.id, True)]
    assert op.work_unit is not None and op.work_unit.wid == 1
