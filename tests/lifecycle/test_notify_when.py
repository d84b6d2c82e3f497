"""notify-when: the encoding, the union of the rules' states, the Update operation on late attach, resumption."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from artifacts import services as artifact_services
from core import pb, task_wire
from core.protos import task_pb2
from lifecycle import notify_when, stamping
from core.errors import NotFound
from tests.lifecycle.conftest import running_work_unit, set_state, xprof_artifact
from workunits import hooks as workunit_hooks
from workunits import outbox
from workunits.models import Operation
from xmc.api import handlers as api_handlers
from xmc.api.registry import Caller
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db
ALL = "STARTING.RUNNING.STOPPED.COMPLETED.FAILED"


def test_it_encodes_in_one_canonical_order_and_matches() -> None:
    assert notify_when.encode(["FAILED", "RUNNING", "STARTING", "COMPLETED", "STOPPED"]) == ALL
    assert notify_when.encode([]) == ""
    assert notify_when.matches(ALL, "RUNNING")
    assert not notify_when.matches(ALL, "SCHEDULING")
    assert not notify_when.matches("", "RUNNING")
    assert notify_when.decode("RUNNING.SOMETHING_NEW") == frozenset({"RUNNING"})
    with pytest.raises(ValueError, match="BOGUS"):
        notify_when.encode(["BOGUS"])


def test_it_is_the_union_of_what_the_rules_want_for_the_work_units_artifacts(lifecycle_on: Any) -> None:
    wu = running_work_unit()
    assert workunit_hooks.notify_when_for(wu.experiment_id, wu.wid) == ""
    artifact_services.create_artifact(wu.experiment_id, wu.wid, pb.artifact.Artifact(
        payload=pb.artifact.ArtifactPayload(text=pb.artifact.TextArtifact(text="hi"))))
    assert workunit_hooks.notify_when_for(wu.experiment_id, wu.wid) == ""  # no rule handles text
    xprof_artifact(wu)
    assert workunit_hooks.notify_when_for(wu.experiment_id, wu.wid) == ALL


def test_it_stamps_nothing_with_the_flag_off(lifecycle_off: Any) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)
    assert workunit_hooks.notify_when_for(wu.experiment_id, wu.wid) == ""


def test_it_refreshes_create_and_restart_tasks_for_resumption(lifecycle_on: Any) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)  # attached while the task was paused
    for kind in (task_pb2.Task.CREATE, task_pb2.Task.RESTART):
        task = task_pb2.Task(type=kind, xid=wu.experiment_id, wid=wu.wid, eid=1)
        assert stamping.refresh(task).notify_when == ALL
    delete = task_pb2.Task(type=task_pb2.Task.DELETE, xid=wu.experiment_id, wid=wu.wid, eid=1, notify_when="x")
    assert stamping.refresh(delete).notify_when == "x"


def _attach(wu: Any, capture: Any) -> None:
    with capture(execute=True):
        xprof_artifact(wu)


def _updates(wu: Any) -> list[Operation]:
    return list(Operation.objects.filter(work_unit=wu, action_type="UPDATE").select_related("work_unit"))


def test_it_records_an_update_operation_sent_after_commit_on_attach_to_a_running_work_unit(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any, delivered: list[list[int]]
) -> None:
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    delivered.clear()
    _attach(wu, django_capture_on_commit_callbacks)
    (op,) = _updates(wu)
    assert delivered == [[op.id]]  # handed to the outbox once the attach committed
    assert (op.task_type, op.eid, op.done) == ("UPDATE", 1, False)
    task = outbox.build_task(op)  # what the actuator gets: computed when sent, from the committed artifacts
    assert task.type == task_pb2.Task.UPDATE
    assert (task.xid, task.wid, task.eid) == (wu.experiment_id, wu.wid, 1)
    assert list(task.update_mask.paths) == ["metadata.annotations.notify-when"]
    assert task.notify_when == ALL and task.operation_name == op.name and task.operation_time_ns > 0
    # An internal operation: the Operations API neither lists nor serves it.
    caller = Caller(Identity(wu.experiment.creator))
    listed = api_handlers.list_operations(
        pb.longrunning.ListOperationsRequest(name=f"experiments/{wu.experiment_id}/operations"), caller)
    assert op.name not in [o.name for o in listed.operations]
    with pytest.raises(NotFound):
        api_handlers.get_operation(pb.longrunning.GetOperationRequest(name=op.name), caller)


def test_it_keeps_an_update_whose_message_is_lost_due_for_the_sweep(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    _attach(wu, django_capture_on_commit_callbacks)
    (op,) = _updates(wu)
    def due(after_s: float) -> bool:
        return op.id in {o.id for o in outbox.due_operations(timezone.now() + timedelta(seconds=after_s))}

    assert due(settings.XMC_OUTBOX_SWEEP_MIN_AGE_S + 1)  # never reached the broker: the sweep sends it
    Operation.objects.filter(id=op.id).update(dispatched_time=timezone.now())
    assert not due(1)  # sent, its lease running
    assert due(settings.XMC_OPERATION_LEASE_S + 1)  # the message was lost: sent again


def test_it_records_nothing_when_the_work_unit_ended_or_the_flag_is_off(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any, delivered: list[list[int]]
) -> None:
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    set_state(wu, "COMPLETED")
    delivered.clear()
    _attach(wu, django_capture_on_commit_callbacks)
    assert _updates(wu) == [] and delivered == []
    lifecycle_on.XMC_ARTIFACT_LIFECYCLE_ENABLED = False
    other = running_work_unit()
    set_state(other, "RUNNING")
    delivered.clear()
    _attach(other, django_capture_on_commit_callbacks)
    assert _updates(other) == [] and delivered == []


def test_it_records_an_update_when_an_update_turns_an_artifact_into_a_handled_kind(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    text = artifact_services.create_artifact(wu.experiment_id, wu.wid, pb.artifact.Artifact(
        payload=pb.artifact.ArtifactPayload(text=pb.artifact.TextArtifact(text="hi"))))
    assert _updates(wu) == []
    message = pb.artifact.Artifact(payload=pb.artifact.ArtifactPayload(
        managed_xprof=pb.artifact.ManagedXprofArtifact(display_name="p", run_group="gs://b/g")))
    with django_capture_on_commit_callbacks(execute=True):
        artifact_services.update_artifact(text.id, message, ["payload"])
    assert len(_updates(wu)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        artifact_services.update_artifact(text.id, message, ["payload"])  # same kind again: no attach
    assert len(_updates(wu)) == 1


def test_it_never_fails_a_create_artifact_over_a_misconfigured_lifecycle(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    lifecycle_on.XMC_MLRUN_PROJECT = ""
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    _attach(wu, django_capture_on_commit_callbacks)  # no exception: the check reports it at start-up
    assert _updates(wu) == []
    assert workunit_hooks.notify_when_for(wu.experiment_id, wu.wid) == ""
