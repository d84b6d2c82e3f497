"""update_work_unit_executions on real Postgres: the transactional rules of docs/architecture/state_machine.md."""
from __future__ import annotations

import pytest
from django.utils import timezone

from core import convert

from core.errors import InvalidArgument
from experiments.models import Experiment
from tests import factories
from workunits import services, state
from workunits.choices import Writer
from workunits.models import StatusHistory, StatusMessage, WorkUnitExecution
from workunits.services import Transition
from workunits.state import ExecutionUpdate
from workunits.wire import execution_to_proto

pytestmark = pytest.mark.django_db

ERROR = {"severity": "ERROR", "source": "KUBERNETES", "userFacingText": "ImagePullBackOff for trainer"}
WARNING = {"severity": "WARNING", "userFacingText": "slow start"}


def later_ns(seconds: float = 1.0) -> int:
    return convert.ns_from_datetime(timezone.now()) + int(seconds * 1e9)


def to(wu, st: str, *, eid: int | None = None, t: int | None = None, mask=(state.STATE,), **kw) -> ExecutionUpdate:
    return ExecutionUpdate(
        xid=wu.experiment_id, wid=wu.wid, eid=eid or wu.current_eid, mask=tuple(mask), state=st,
        state_update_time_ns=later_ns() if t is None else t, **kw,
    )


def current(wu) -> WorkUnitExecution:
    wu.refresh_from_db()
    return WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid)


def test_it_skips_an_update_fenced_by_eid_and_changes_nothing() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.restart_work_units(exp.id, [wu.wid], batch=False)  # eid 2 is current now
    before = list(StatusHistory.objects.values_list("id", flat=True))

    transitions = services.update_work_unit_executions([to(wu, "RUNNING", eid=1)])

    assert transitions == []
    assert current(wu).state == "RESTARTING"
    assert WorkUnitExecution.objects.get(work_unit=wu, eid=1).state == "INITIALIZING"
    assert list(StatusHistory.objects.values_list("id", flat=True)) == before


def test_it_fails_the_whole_batch_when_a_state_update_has_no_time() -> None:
    exp = factories.experiment()
    wu1, wu2 = factories.work_unit(exp), factories.work_unit(exp)
    good = to(wu1, "SCHEDULING")
    bad = to(wu2, "SCHEDULING", t=None)
    bad = ExecutionUpdate(**{**bad.__dict__, "state_update_time_ns": None})

    with pytest.raises(InvalidArgument) as exc:
        services.update_work_unit_executions([good, bad])

    assert exc.value.field == "status.state_update_time"
    assert current(wu1).state == "INITIALIZING"  # the good update was not written either


def test_it_drops_a_stale_state_change_in_a_batch() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.update_work_unit_executions([to(wu, "RUNNING", t=later_ns(10))])
    assert services.update_work_unit_executions([to(wu, "STARTING", t=later_ns(5))]) == []
    assert current(wu).state == "RUNNING"


def test_it_writes_stopping_over_a_reconciler_clock_that_runs_ahead() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.update_work_unit_executions([to(wu, "RUNNING", t=later_ns(3600))])  # an hour in the future
    services.stop_work_units(exp.id, [wu.wid], batch=False)
    assert current(wu).state == "STOPPING"


def test_it_returns_committed_transitions_only() -> None:
    exp = factories.experiment()
    wu1, wu2 = factories.work_unit(exp), factories.work_unit(exp)
    transitions = services.update_work_unit_executions([
        to(wu1, "SCHEDULING"),
        to(wu2, "INITIALIZING"),  # insert-only state: dropped
        to(wu2, "RUNNING", eid=7),  # fenced
    ])
    assert transitions == [Transition(exp.id, wu1.wid, 1, "INITIALIZING", "SCHEDULING")]


def test_it_applies_several_updates_of_one_work_unit_in_order() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    t = later_ns()
    transitions = services.update_work_unit_executions([
        to(wu, "SCHEDULING", t=t), to(wu, "STARTING", t=t + 1), to(wu, "RUNNING", t=t + 2),
    ])
    assert [tr.new_state for tr in transitions] == ["SCHEDULING", "STARTING", "RUNNING"]
    assert current(wu).state == "RUNNING"
    assert Experiment.objects.get(id=exp.id).child_state_counts == {"RUNNING": 1}


def test_it_records_history_in_the_same_transaction_with_the_writer() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.update_work_unit_executions([to(wu, "SCHEDULING", writer=Writer.RECONCILER, request_id="obs-1")])
    rows = list(StatusHistory.objects.filter(execution__work_unit=wu).order_by("id"))
    assert [(r.from_state, r.to_state, r.writer) for r in rows] == [
        ("", "INITIALIZING", "state_server"),
        ("INITIALIZING", "SCHEDULING", "reconciler"),
    ]
    assert rows[-1].request_id == "obs-1"
    assert rows[-1].extra["mask"] == ["status.state"]


def test_it_records_a_new_message_even_without_a_state_change() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.update_work_unit_executions([to(wu, None, mask=(state.SYSTEM_MESSAGE,), t=None, system_message=ERROR)])
    services.update_work_unit_executions([to(wu, None, mask=(state.SYSTEM_MESSAGE,), t=None, system_message=ERROR)])

    rows = list(StatusMessage.objects.filter(work_unit=wu))
    assert len(rows) == 1  # the re-sent diagnostic is not new
    assert rows[0].severity == "ERROR" and rows[0].source == "KUBERNETES" and rows[0].execution_id == 1
    assert rows[0].content["userFacingText"] == ERROR["userFacingText"]
    assert "createTime" in rows[0].content
    assert current(wu).system_message["userFacingText"] == ERROR["userFacingText"]
    assert StatusHistory.objects.filter(execution__work_unit=wu).count() == 2  # insert + one accepted change


def test_it_counts_child_states_on_the_experiment() -> None:
    exp = factories.experiment()
    wus = [factories.work_unit(exp) for _ in range(3)]
    assert Experiment.objects.get(id=exp.id).child_state_counts == {"INITIALIZING": 3}
    services.update_work_unit_executions([to(wus[0], "RUNNING"), to(wus[1], "FAILED")])
    assert Experiment.objects.get(id=exp.id).child_state_counts == {"INITIALIZING": 1, "RUNNING": 1, "FAILED": 1}


def test_it_counts_each_work_units_highest_message_severity() -> None:
    exp = factories.experiment()
    wu1, wu2 = factories.work_unit(exp), factories.work_unit(exp)
    services.update_work_unit_executions([
        to(wu1, None, mask=(state.SYSTEM_MESSAGE, state.USER_MESSAGE), t=None, system_message=ERROR,
           user_message=WARNING),
        to(wu2, None, mask=(state.USER_MESSAGE,), t=None, user_message=WARNING),
    ])
    assert Experiment.objects.get(id=exp.id).message_severity_counts == {"ERROR": 1, "WARNING": 1}
    services.update_work_unit_executions([to(wu1, "RUNNING")])  # state change resets wu1's messages
    assert Experiment.objects.get(id=exp.id).message_severity_counts == {"WARNING": 1}


def test_it_marks_the_experiment_inactive_when_all_work_units_are_terminal() -> None:
    exp = factories.experiment()
    wu1, wu2 = factories.work_unit(exp), factories.work_unit(exp)
    from experiments import services as exp_services
    from core import pb

    exp_services.update_launch_state(exp.id, pb.status.ExperimentStatus.LaunchState.COMPLETED)
    services.update_work_unit_executions([to(wu1, "COMPLETED")])
    assert Experiment.objects.get(id=exp.id).active_state == "ACTIVE"
    services.update_work_unit_executions([to(wu2, "FAILED")])
    exp.refresh_from_db()
    assert exp.active_state == "INACTIVE"
    assert exp.complete_time is not None


def test_it_keeps_the_experiment_active_while_launching() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.update_work_unit_executions([to(wu, "COMPLETED")])
    exp.refresh_from_db()
    assert exp.active_state == "ACTIVE" and exp.complete_time is None


def test_it_marks_the_experiment_inactive_when_the_launch_failed() -> None:
    from experiments import services as exp_services
    from core import pb

    exp = factories.experiment()
    factories.work_unit(exp)
    exp = exp_services.update_launch_state(exp.id, pb.status.ExperimentStatus.LaunchState.FAILED)
    assert exp.active_state == "INACTIVE" and exp.complete_time is not None


def test_it_sets_the_execution_complete_time_on_a_terminal_state() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.update_work_unit_executions([to(wu, "RUNNING")])
    assert current(wu).complete_time is None
    services.update_work_unit_executions([to(wu, "COMPLETED")])
    assert current(wu).complete_time is not None


def test_it_skips_updates_for_work_units_that_do_not_exist() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    ghost = ExecutionUpdate(xid=exp.id, wid=99, eid=1, mask=(state.STATE,), state="RUNNING",
                            state_update_time_ns=later_ns())
    assert services.update_work_unit_executions([ghost, to(wu, "SCHEDULING")])[0].wid == wu.wid


def test_it_records_the_mlrun_url_in_execution_metadata() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.update_work_unit_executions([to(wu, None, mask=(state.MLRUN_URL,), t=None,
                                              mlrun_url="https://console.example/runs/r1")])
    proto = execution_to_proto(current(wu))
    assert proto.metadata.mlrun_url == "https://console.example/runs/r1"
    assert proto.metadata.resource_name == f"xmc-{exp.id}-{wu.wid}"


def test_it_skips_a_fenced_update_without_a_time_instead_of_failing_the_batch() -> None:
    exp = factories.experiment()
    wu1, wu2 = factories.work_unit(exp), factories.work_unit(exp)
    fenced = ExecutionUpdate(xid=exp.id, wid=wu2.wid, eid=wu2.current_eid + 1, mask=(state.STATE,),
                             state="RUNNING", state_update_time_ns=None)
    ghost = ExecutionUpdate(xid=exp.id, wid=99, eid=1, mask=("status.nonsense",))

    transitions = services.update_work_unit_executions([fenced, ghost, to(wu1, "SCHEDULING")])

    assert transitions == [Transition(exp.id, wu1.wid, 1, "INITIALIZING", "SCHEDULING")]
    assert current(wu2).state == "INITIALIZING"


def test_it_names_every_invalid_update_so_a_caller_can_drop_them_and_retry_the_rest() -> None:
    exp = factories.experiment()
    wu1, wu2, wu3 = (factories.work_unit(exp) for _ in range(3))
    no_time = ExecutionUpdate(**{**to(wu2, "RUNNING").__dict__, "state_update_time_ns": None})
    bad_state = to(wu3, "NOT_A_STATE")
    batch = [to(wu1, "SCHEDULING"), no_time, bad_state]

    with pytest.raises(services.InvalidUpdates) as exc:
        services.update_work_unit_executions(batch)

    assert isinstance(exc.value, InvalidArgument)
    assert exc.value.keys == ((exp.id, wu2.wid, 1), (exp.id, wu3.wid, 1))
    assert [u for u, _ in exc.value.invalid] == [no_time, bad_state]
    assert exc.value.field == "status.state_update_time"
    assert f"experiments/{exp.id}/workUnits/{wu3.wid}/executions/1" in exc.value.message
    assert current(wu1).state == "INITIALIZING"  # nothing of the batch was written

    bad = {id(u) for u, _ in exc.value.invalid}
    services.update_work_unit_executions([u for u in batch if id(u) not in bad])
    assert current(wu1).state == "SCHEDULING"
