"""notify-when: the encoding, the union of the rules' states, the Update task on late attach, resumption."""
from __future__ import annotations

from typing import Any

import pytest

from artifacts import services as artifact_services
from core import pb, task_wire
from core.protos import task_pb2
from lifecycle import notify_when, stamping
from tests.lifecycle import brokers
from tests.lifecycle.conftest import running_work_unit, set_state, xprof_artifact
from workunits import hooks as workunit_hooks

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
    brokers.purge("actuator")
    with capture(execute=True):
        xprof_artifact(wu)


def test_it_sends_an_update_task_after_commit_on_attach_to_a_running_work_unit(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    _attach(wu, django_capture_on_commit_callbacks)
    sent = brokers.drain("actuator")
    assert [name for name, _ in sent] == ["xmc.actuator.update"]
    task = task_wire.decode_task(sent[0][1][0])  # signed, verified
    assert task.type == task_pb2.Task.UPDATE
    assert (task.xid, task.wid, task.eid) == (wu.experiment_id, wu.wid, 1)
    assert list(task.update_mask.paths) == ["metadata.annotations.notify-when"]
    assert task.notify_when == ALL
    assert task.operation_time_ns > 0


def test_it_sends_nothing_when_the_work_unit_ended_or_the_flag_is_off(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    set_state(wu, "COMPLETED")
    _attach(wu, django_capture_on_commit_callbacks)
    assert brokers.drain("actuator") == []
    lifecycle_on.XMC_ARTIFACT_LIFECYCLE_ENABLED = False
    other = running_work_unit()
    set_state(other, "RUNNING")
    _attach(other, django_capture_on_commit_callbacks)
    assert brokers.drain("actuator") == []


def test_it_sends_an_update_task_when_an_update_turns_an_artifact_into_a_handled_kind(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    text = artifact_services.create_artifact(wu.experiment_id, wu.wid, pb.artifact.Artifact(
        payload=pb.artifact.ArtifactPayload(text=pb.artifact.TextArtifact(text="hi"))))
    brokers.purge("actuator")
    message = pb.artifact.Artifact(payload=pb.artifact.ArtifactPayload(
        managed_xprof=pb.artifact.ManagedXprofArtifact(display_name="p", run_group="gs://b/g")))
    with django_capture_on_commit_callbacks(execute=True):
        artifact_services.update_artifact(text.id, message, ["payload"])
    sent = brokers.drain("actuator")
    assert [name for name, _ in sent] == ["xmc.actuator.update"]
    with django_capture_on_commit_callbacks(execute=True):
        artifact_services.update_artifact(text.id, message, ["payload"])  # same kind again: no attach
    assert brokers.drain("actuator") == []


def test_it_never_fails_a_create_artifact_over_a_misconfigured_lifecycle(
    lifecycle_on: Any, django_capture_on_commit_callbacks: Any
) -> None:
    lifecycle_on.XMC_MLRUN_PROJECT = ""
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    _attach(wu, django_capture_on_commit_callbacks)  # no exception: the check reports it at start-up
    assert brokers.drain("actuator") == []
    assert workunit_hooks.notify_when_for(wu.experiment_id, wu.wid) == ""
