"""Create, stop and restart work units; create and update experiments."""
from __future__ import annotations

import pytest
from django.utils import timezone

from core import convert, pb

from experiments.wire import experiment_to_proto

from core.errors import FailedPrecondition, InvalidArgument, NotFound
from experiments import services as exp_services
from experiments.models import Experiment
from tests import factories
from workunits import services, state
from workunits.models import Operation, StatusHistory, WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate
from workunits.wire import operation_to_proto

pytestmark = pytest.mark.django_db


def current(wu: WorkUnit) -> WorkUnitExecution:
    wu.refresh_from_db()
    return WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid)


def set_state(wu: WorkUnit, st: str) -> None:
    services.update_work_unit_executions([ExecutionUpdate(
        xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE,), state=st,
        state_update_time_ns=convert.ns_from_datetime(timezone.now()) + 1_000_000,
    )])


# --- Experiments ----------------------------------------------------------------------


def test_it_fills_defaults_for_an_empty_experiment() -> None:
    exp = exp_services.create_experiment(pb.experiment.Experiment(), creator="alice@example.com")
    message = experiment_to_proto(exp)
    assert message.name == f"experiments/{exp.id}"
    assert message.creator == "alice@example.com"
    assert message.priority == pb.priority.Priority.NORMAL
    assert [r.user for r in message.acls.owners] == ["alice@example.com"]
    assert message.status.active_state == pb.status.ExperimentStatus.ActiveState.ACTIVE
    assert message.status.launch_state == pb.status.ExperimentStatus.LaunchState.LAUNCHING
    assert message.create_time.seconds > 0


def test_it_keeps_what_the_client_sent() -> None:
    exp = factories.experiment(title="edge", tags=["a", "b"], notes="n", priority=pb.priority.Priority.HIGH)
    message = experiment_to_proto(exp)
    assert (message.title, list(message.tags), message.notes, message.priority) == ("edge", ["a", "b"], "n", 3)


def test_it_replaces_repeated_fields_on_update() -> None:
    exp = factories.experiment(tags=["a", "b"])
    exp = exp_services.update_experiment(exp.id, pb.experiment.Experiment(tags=["c"], title="ignored"), ["tags"])
    assert exp.tags == ["c"] and exp.title == ""


def test_it_rejects_an_unknown_update_mask_path_and_writes_nothing() -> None:
    exp = factories.experiment(title="before")
    with pytest.raises(InvalidArgument) as exc:
        exp_services.update_experiment(exp.id, pb.experiment.Experiment(title="after"), ["title", "creator"])
    assert exc.value.field == "update_mask" and "creator" in exc.value.message
    assert Experiment.objects.get(id=exp.id).title == "before"


def test_it_rejects_an_unknown_launch_state() -> None:
    exp = factories.experiment()
    with pytest.raises(InvalidArgument) as exc:
        exp_services.update_launch_state(exp.id, 42)
    assert exc.value.field == "launch_state"


# --- Create work unit --------------------------------------------------------------------


def test_it_creates_a_work_unit_initializing_with_its_operation(delivered, django_capture_on_commit_callbacks) -> None:
    exp = factories.experiment()
    with django_capture_on_commit_callbacks(execute=True):
        op = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    wu = WorkUnit.objects.get(experiment=exp, wid=1)
    ex = current(wu)
    assert (ex.eid, ex.state, ex.execution_state) == (1, "INITIALIZING", "ACTIVE")
    assert op.name == f"experiments/{exp.id}/workUnits/1/operations/{op.id}"
    assert (op.action_type, op.task_type, op.eid, op.done) == ("CREATE", "CREATE", 1, False)
    assert wu.priority == "NORMAL"  # the experiment's
    assert delivered == [[op.id]]  # handed to the outbox after commit
    message = operation_to_proto(op)
    metadata = pb.operations.OperationMetadata()
    assert message.metadata.Unpack(metadata) and metadata.target == wu.name
    assert metadata.action_type == pb.operations.OperationMetadata.ActionType.CREATE


def test_it_is_idempotent_on_the_work_unit_id(delivered, django_capture_on_commit_callbacks) -> None:
    exp = factories.experiment()
    with django_capture_on_commit_callbacks(execute=True):
        first = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    with django_capture_on_commit_callbacks(execute=True):
        again = services.create_work_unit(exp.id, factories.work_unit_message(name="other"), work_unit_id=1)
    assert again.id == first.id
    assert WorkUnit.objects.filter(experiment=exp).count() == 1
    assert WorkUnitExecution.objects.filter(work_unit__experiment=exp).count() == 1
    assert Operation.objects.filter(experiment=exp).count() == 1
    assert Experiment.objects.get(id=exp.id).child_state_counts == {"INITIALIZING": 1}
    assert delivered == [[first.id]]


def test_it_allocates_a_wid_when_none_is_given() -> None:
    exp = factories.experiment()
    services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=2)
    op = services.create_work_unit(exp.id, factories.work_unit_message())
    assert op.work_unit.wid == 3


@pytest.mark.parametrize("launch_state", [2, 3])
def test_it_accepts_work_units_in_any_launch_state(launch_state: int) -> None:
    exp = factories.experiment()
    exp_services.update_launch_state(exp.id, launch_state)
    op = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    assert op.work_unit.wid == 1


def test_it_reactivates_an_experiment_whose_work_units_arrive_after_launch_completed() -> None:
    exp = factories.experiment()
    exp = exp_services.update_launch_state(exp.id, 2)
    assert exp.active_state == "INACTIVE"  # no work unit yet
    factories.work_unit(exp)
    exp.refresh_from_db()
    assert exp.active_state == "ACTIVE" and exp.complete_time is None


@pytest.mark.parametrize(
    "job_kw,field",
    [
        ({"name": "Trainer_1"}, "work_unit.executable.jobset.jobs[0].name"),
        ({"replicas": 0}, "work_unit.executable.jobset.jobs[0].replicas"),
        ({"host_network": True}, "work_unit.executable.jobset.jobs[0].host_network"),
    ],
)
def test_it_rejects_a_bad_executable_naming_the_field_and_writes_nothing(job_kw, field) -> None:
    exp = factories.experiment()
    with pytest.raises(InvalidArgument) as exc:
        services.create_work_unit(exp.id, factories.work_unit_message(**job_kw), work_unit_id=1)
    assert exc.value.field == field
    assert not WorkUnit.objects.filter(experiment=exp).exists()
    assert not Operation.objects.exists()


def test_it_rejects_an_executable_without_jobs_cpu_without_memory_and_unknown_gpus() -> None:
    exp = factories.experiment()
    empty = pb.work_unit.WorkUnit(executable=pb.work_unit.Executable(jobset=pb.work_unit.JobSetExecutable()))
    with pytest.raises(InvalidArgument, match="at least one job"):
        services.create_work_unit(exp.id, empty)
    msg = factories.work_unit_message()
    msg.executable.jobset.jobs[0].spec.resources.cpu_resources.memory_bytes = 0
    with pytest.raises(InvalidArgument, match="memory_bytes"):
        services.create_work_unit(exp.id, msg)
    msg = factories.work_unit_message()
    msg.executable.jobset.jobs[0].spec.resources.gpu_resources.type = "Z9000"
    msg.executable.jobset.jobs[0].spec.resources.gpu_resources.count = 1
    with pytest.raises(InvalidArgument, match="unknown GPU type"):
        services.create_work_unit(exp.id, msg)
    dup = factories.work_unit_message()
    dup.executable.jobset.jobs.append(dup.executable.jobset.jobs[0])
    with pytest.raises(InvalidArgument, match="duplicate job name"):
        services.create_work_unit(exp.id, dup)
    assert not WorkUnit.objects.exists()


def test_it_answers_not_found_for_an_unknown_experiment() -> None:
    with pytest.raises(NotFound):
        services.create_work_unit(987654, factories.work_unit_message())


# --- Stop ------------------------------------------------------------------------------------


def test_it_stops_a_running_work_unit(delivered, django_capture_on_commit_callbacks) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    set_state(wu, "RUNNING")
    with django_capture_on_commit_callbacks(execute=True):
        op = services.stop_work_units(exp.id, [wu.wid], batch=False)
    assert current(wu).state == "STOPPING"
    assert (op.action_type, op.task_type, op.target_eid) == ("STOP", "DELETE", 1)
    assert delivered[-1] == [op.id]
    assert Experiment.objects.get(id=exp.id).child_state_counts == {"STOPPING": 1}


def test_it_stops_a_paused_work_unit_directly() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    set_state(wu, "SCHEDULING_PAUSED")
    services.stop_work_units(exp.id, [wu.wid], batch=False)
    assert current(wu).state == "STOPPED"


def test_it_returns_the_pending_stop_when_stopped_twice() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    first = services.stop_work_units(exp.id, [wu.wid], batch=False)
    again = services.stop_work_units(exp.id, [wu.wid], batch=False)
    assert again.id == first.id
    assert Operation.objects.filter(action_type="STOP").count() == 1


def test_it_refuses_to_stop_a_terminal_work_unit() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    set_state(wu, "COMPLETED")
    with pytest.raises(FailedPrecondition, match="COMPLETED"):
        services.stop_work_units(exp.id, [wu.wid], batch=False)


def test_it_batch_stops_every_work_unit_with_one_operation(delivered, django_capture_on_commit_callbacks) -> None:
    exp = factories.experiment()
    wus = [factories.work_unit(exp) for _ in range(3)]
    set_state(wus[2], "COMPLETED")
    with django_capture_on_commit_callbacks(execute=True):
        op = services.stop_work_units(exp.id, None, batch=True)
    assert op.name == f"experiments/{exp.id}/operations/{op.id}"
    assert [current(w).state for w in wus] == ["STOPPING", "STOPPING", "COMPLETED"]
    assert op.children.count() == 2
    assert sorted(delivered[-1]) == sorted(op.children.values_list("id", flat=True))


def test_it_batch_stops_all_or_nothing() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    with pytest.raises(NotFound, match="42"):
        services.stop_work_units(exp.id, [wu.wid, 42], batch=True)
    assert current(wu).state == "INITIALIZING"
    assert not Operation.objects.filter(action_type="STOP").exists()


# --- Restart ----------------------------------------------------------------------------------


def test_it_restarts_into_a_new_execution(delivered, monkeypatch, django_capture_on_commit_callbacks) -> None:
    superseded = []
    monkeypatch.setattr("workunits.services.commands.on_execution_superseded", lambda *a: superseded.append(a))
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    set_state(wu, "FAILED")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        op = services.restart_work_units(exp.id, [wu.wid], batch=False)
        assert superseded == []  # not before commit
    old = WorkUnitExecution.objects.get(work_unit=wu, eid=1)
    new = current(wu)
    assert (old.execution_state, old.state) == ("INACTIVE", "FAILED")
    assert (new.eid, new.execution_state, new.state) == (2, "ACTIVE", "RESTARTING")
    assert (op.task_type, op.eid, op.target_eid) == ("RESTART", 2, 1)
    assert superseded == [(exp.id, wu.wid, 1)]
    assert delivered[-1] == [op.id]
    exp.refresh_from_db()
    assert exp.child_state_counts == {"RESTARTING": 1}
    assert StatusHistory.objects.filter(execution=new, to_state="RESTARTING").exists()


def test_it_does_not_call_the_superseded_hook_when_the_restart_rolls_back(
    monkeypatch, django_capture_on_commit_callbacks
) -> None:
    superseded = []
    monkeypatch.setattr("workunits.services.commands.on_execution_superseded", lambda *a: superseded.append(a))
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(NotFound):
        services.restart_work_units(exp.id, [wu.wid, 5], batch=True)
    assert superseded == []
    assert current(wu).eid == 1


def test_it_batch_restarts_with_one_operation() -> None:
    exp = factories.experiment()
    wus = [factories.work_unit(exp) for _ in range(2)]
    op = services.restart_work_units(exp.id, None, batch=True)
    assert op.work_unit is None and op.children.count() == 2
    assert [current(w).eid for w in wus] == [2, 2]


def test_it_keeps_exactly_one_active_execution_through_restarts() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    for _ in range(3):
        services.restart_work_units(exp.id, [wu.wid], batch=False)
    assert WorkUnitExecution.objects.filter(work_unit=wu, execution_state="ACTIVE").count() == 1
    assert current(wu).eid == 4


def test_it_replaces_work_unit_fields_on_update() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    updated = services.update_work_unit(exp.id, wu.wid, pb.work_unit.WorkUnit(tags=["x"], notes="hi"), ["tags", "notes"])
    assert (updated.tags, updated.notes) == (["x"], "hi")
    with pytest.raises(InvalidArgument, match="executable"):
        services.update_work_unit(exp.id, wu.wid, pb.work_unit.WorkUnit(), ["executable"])


def test_it_records_an_enqueue_failure_of_a_create_as_fatal_without_force() -> None:
    # STATES.md: FATAL for a Create or Restart that could not be enqueued, ERROR on Stop.
    exp = factories.experiment()
    op = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    services.record_enqueue_failure(op.id, "broker down")
    ex = current(op.work_unit)
    assert ex.system_message["severity"] == "FATAL" and "broker down" in ex.system_message["userFacingText"]


def test_it_records_an_enqueue_failure_of_a_stop_as_an_error_without_force() -> None:
    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    stop = services.stop_work_units(exp.id, [1], batch=False)
    services.record_enqueue_failure(stop.id, "broker down")
    ex = current(create.work_unit)
    assert ex.system_message["severity"] == "ERROR" and "broker down" in ex.system_message["userFacingText"]
    services.record_enqueue_failure(stop.id, "second failure")
    assert "broker down" in current(create.work_unit).system_message["userFacingText"]  # deferred


def test_it_keeps_undelivered_operations_in_the_outbox(monkeypatch, django_capture_on_commit_callbacks) -> None:
    from datetime import timedelta

    from workunits import outbox

    def broker_down(ops, notify_when=None):
        raise ConnectionError("redis is down")

    monkeypatch.setattr("workunits.outbox.deliver_committed", broker_down)
    exp = factories.experiment()
    with django_capture_on_commit_callbacks(execute=True):
        op = services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=1)
    later = timezone.now() + timedelta(minutes=1)
    # The failed hand-over lost nothing: the sweep finds the committed operation.
    assert list(outbox.undispatched_operations(later)) == [op]
    Operation.objects.filter(id=op.id).update(dispatched_time=timezone.now())
    assert list(outbox.undispatched_operations(later)) == []
