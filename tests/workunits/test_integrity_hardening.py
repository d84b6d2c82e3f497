"""Idempotency after DeleteOperation, and an identical re-sent message is not a change."""
from __future__ import annotations

import pytest

from core import pb
from tests import factories
from workunits import services, state
from workunits.models import Operation, StatusHistory, StatusMessage, WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db

ERROR = {"severity": "ERROR", "source": "KUBERNETES", "userFacingText": "ImagePullBackOff for trainer"}


def test_it_returns_the_existing_work_unit_when_create_is_retried_after_delete_operation() -> None:
    exp = factories.experiment()
    first = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=7)
    Operation.objects.filter(id=first.id).update(done=True)  # as the actuator would, eventually
    services.delete_operation(first.id)

    again = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=7)

    assert again.done and again.error is None
    assert again.work_unit is not None and again.work_unit.wid == 7
    response = pb.work_unit.WorkUnit()
    assert again.response is not None
    from google.protobuf import any_pb2, json_format
    packed = json_format.ParseDict(again.response, any_pb2.Any())
    assert packed.Unpack(response) and response.name == f"experiments/{exp.id}/workUnits/7"
    assert WorkUnit.objects.filter(experiment=exp).count() == 1
    assert WorkUnitExecution.objects.filter(work_unit__experiment=exp).count() == 1
    # And a third retry finds the fresh operation: still one work unit, no new operation.
    assert services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=7).id == again.id


def test_it_keeps_the_stored_message_when_an_identical_one_is_re_sent() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    update = ExecutionUpdate(xid=exp.id, wid=wu.wid, eid=1, mask=(state.SYSTEM_MESSAGE,), system_message=dict(ERROR))
    services.update_work_unit_executions([update])
    stored = WorkUnitExecution.objects.get(work_unit=wu, eid=1).system_message
    assert stored is not None and "createTime" in stored
    history = StatusHistory.objects.count()
    messages = StatusMessage.objects.count()

    services.update_work_unit_executions([update])  # the very same message, without createTime

    assert WorkUnitExecution.objects.get(work_unit=wu, eid=1).system_message == stored
    assert StatusHistory.objects.count() == history
    assert StatusMessage.objects.count() == messages
