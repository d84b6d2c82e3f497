"""The orphan sweep on a full resync: every case of STATES.md, and what it must leave alone."""
from __future__ import annotations

import types

import pytest

from k8s_bridge.reconciler import sweep
from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, execution, state_of
from tests.waiting import eventually
from workunits import services
from workunits.choices import TaskType, WorkUnitState
from workunits.models import Operation

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState


def actuator_finished(wu, task_type: str, error: dict | None = None) -> None:
    """What the actuator records when it is done with a task (its operation row)."""
    Operation.objects.filter(work_unit=wu, task_type=task_type).update(done=True, error=error)


def test_it_stops_a_stopping_execution_whose_jobset_is_gone(cluster: Cluster, make_reconciler) -> None:
    rec = make_reconciler()
    wu = factories.work_unit(factories.experiment())
    actuator_finished(wu, TaskType.CREATE)
    services.stop_work_units(wu.experiment_id, [wu.wid], batch=False)
    assert state_of(wu) == S.STOPPING
    repairs = rec.resync()
    assert [r.case for r in repairs] == ["stopping_without_jobset"]
    assert state_of(wu) == S.STOPPED


def test_it_fails_an_execution_whose_jobset_vanished_without_the_finalizer(cluster: Cluster, make_reconciler) -> None:
    rec = make_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")
    actuator_finished(wu, TaskType.CREATE)
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    cluster.strip_finalizer_and_delete(wu)
    eventually(lambda: cluster.jobset(wu) is None, what="JobSet gone")
    assert state_of(wu) == S.RUNNING  # no event will ever repair this
    rec.resync()
    ex = execution(wu)
    assert ex.state == S.FAILED
    assert ex.system_message["severity"] == "ERROR"
    assert "finalizer" in ex.system_message["userFacingText"]


def test_it_fails_a_created_execution_without_jobset_once_its_operation_is_done(cluster: Cluster, make_reconciler) -> None:
    rec = make_reconciler()
    wu = factories.work_unit(factories.experiment())
    actuator_finished(wu, TaskType.CREATE, error={"code": 3, "message": "hostNetwork needs exclusive topology"})
    rec.resync()
    ex = execution(wu)
    assert ex.state == S.FAILED
    assert "hostNetwork needs exclusive topology" in ex.system_message["userFacingText"]


def test_it_never_touches_an_execution_whose_create_is_still_pending(cluster: Cluster, make_reconciler) -> None:
    rec = make_reconciler()
    wu = factories.work_unit(factories.experiment())
    stopping = factories.work_unit(wu.experiment)
    services.stop_work_units(wu.experiment_id, [stopping.wid], batch=False)
    assert rec.resync() == []

    assert state_of(stopping) == S.STOPPING


def test_it_deletes_the_jobset_of_an_archived_execution(cluster: Cluster, make_reconciler) -> None:
    rec = make_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")
    actuator_finished(wu, TaskType.CREATE)
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    services.restart_work_units(wu.experiment_id, [wu.wid], batch=False)
    assert rec.resync() == []  # the restart operation is pending: the actuator is on it
    assert cluster.jobset(wu) is not None
    actuator_finished(wu, TaskType.RESTART)  # ... and it lost the JobSet swap
    cases = sorted(r.case for r in rec.resync())
    assert cases == ["created_without_jobset", "jobset_of_archived_execution"]
    eventually(lambda: cluster.jobset(wu) is None, what="eid-1 JobSet deleted (finalizer removed, fenced)")
    assert execution(wu, 1).state == S.RUNNING  # history is untouched
    assert state_of(wu, 2) == S.FAILED


def test_it_deletes_a_jobset_whose_work_unit_does_not_exist(cluster: Cluster, make_reconciler) -> None:
    rec = make_reconciler()
    exp = factories.experiment()
    ghost = types.SimpleNamespace(experiment_id=exp.id, wid=77, current_eid=1, refresh_from_db=lambda: None)
    cluster.create_jobset(ghost, script="pull=1s;run=300s;exit=0")
    assert [r.case for r in rec.resync()] == ["jobset_without_work_unit"]
    eventually(lambda: cluster.jobset(ghost) is None, what="ghost JobSet deleted and its finalizer removed")


def test_it_leaves_jobsets_and_executions_that_agree_alone(cluster: Cluster, make_reconciler) -> None:
    rec = make_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")
    actuator_finished(wu, TaskType.CREATE)
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    assert rec.resync() == []
    assert state_of(wu) == S.RUNNING and cluster.jobset(wu) is not None


def test_it_spares_the_jobset_of_a_work_unit_created_between_its_snapshot_and_its_list(
        cluster: Cluster, make_reconciler, monkeypatch) -> None:
    """A JobSet the list shows but the snapshot had no work unit for is only deleted if,
    read again after the list, the work unit still does not exist (seen with a stalled API server)."""
    rec = make_reconciler()
    exp = factories.experiment()
    made = []
    taken = sweep.snapshot

    def snapshot_then_launch(namespace: str) -> sweep.Snapshot:
        snap = taken(namespace)
        wu = factories.work_unit(exp)  # committed after the snapshot ...
        cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")  # ... its JobSet before the list
        made.append(wu)
        return snap

    monkeypatch.setattr(sweep, "snapshot", snapshot_then_launch)
    assert rec.resync() == []
    (wu,) = made
    assert cluster.jobset(wu) is not None
    assert cluster.jobset(wu)["metadata"].get("deletionTimestamp") is None


@pytest.mark.parametrize("after_queries", [1, 2, 3, 4])
def test_it_takes_its_snapshot_at_one_point_in_time_for_a_work_unit_committed_while_it_reads(
        cluster: Cluster, make_reconciler, after_queries: int) -> None:
    """A work unit (with its pending create) committed between the snapshot's queries is seen whole
    or not at all: its execution without its operation read as a create done without JobSet."""
    import threading

    from django.db import connection, connections

    rec = make_reconciler()
    exp = factories.experiment()
    made = []

    def launch_elsewhere() -> None:
        try:
            made.append(factories.work_unit(exp))
        finally:
            connections.close_all()

    queries = []

    def after_some_queries(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        queries.append(sql)
        if len(queries) == after_queries:
            thread = threading.Thread(target=launch_elsewhere)
            thread.start()
            thread.join()
        return result

    with connection.execute_wrapper(after_some_queries):
        repairs = rec.resync()
    (wu,) = made
    assert [r for r in repairs if r.key.wid == wu.wid] == []
    assert state_of(wu) == S.INITIALIZING


def test_it_repairs_every_execution_when_one_create_failed_with_an_error(cluster: Cluster, make_reconciler) -> None:
    """The failed create's error is attached to its own execution, not to another one read after it."""
    rec = make_reconciler()
    exp = factories.experiment()
    failed = factories.work_unit(exp)
    actuator_finished(failed, TaskType.CREATE, error={"code": 3, "message": "no such image"})
    stopping = [factories.work_unit(exp) for _ in range(3)]
    for wu in stopping:
        actuator_finished(wu, TaskType.CREATE)
    services.stop_work_units(exp.id, [wu.wid for wu in stopping], batch=True)
    repairs = rec.resync()
    assert sorted((r.key.wid, r.case) for r in repairs) == sorted(
        [(failed.wid, "created_without_jobset")] + [(wu.wid, "stopping_without_jobset") for wu in stopping])
    assert "no such image" in execution(failed).system_message["userFacingText"]
    assert all(state_of(wu) == S.STOPPED for wu in stopping)
