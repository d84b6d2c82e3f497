"""The outbox: what is sent, when it counts as dispatched, what the sweeps do."""
from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import pb, task_wire
from core.protos import task_pb2
from delivery import tasks as delivery_tasks
from k8s_bridge import tasks
from tests import factories
from tests.k8s_bridge.actuator.conftest import REAL_DELIVER
from workunits import outbox, services
from workunits.models import Operation, WorkUnitExecution
from xmc import broker
from xmc.celery import app

pytestmark = pytest.mark.django_db


def _create_task(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Operation, task_pb2.Task]:
    """A new work unit's Create operation and the task the outbox builds from it."""
    monkeypatch.setattr("workunits.hooks.notify_when_for", lambda xid, wid: "COMPLETED")
    exp = factories.experiment()
    op = Operation.objects.select_related("work_unit").get(
        id=services.create_work_unit(exp.id, factories.work_unit_message()).id)
    return exp, op, outbox.build_task(op)


def test_it_builds_a_create_task_from_the_row(monkeypatch: pytest.MonkeyPatch) -> None:
    exp, op, task = _create_task(monkeypatch)
    assert (task.type, task.xid, task.wid, task.eid, task.target_eid) == (task_pb2.Task.CREATE, exp.id, 1, 1, 0)
    assert task.operation_name == f"experiments/{exp.id}/workUnits/1/operations/{op.id}"
    assert task.notify_when == "COMPLETED"
    work_unit = pb.work_unit.WorkUnit()
    assert task.work_unit.Unpack(work_unit)
    assert work_unit.executable.jobset.jobs[0].name == "trainer"


def test_it_has_the_runner_read_the_operation_name_as_the_api_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """core.names owns the operation name's shape: a task names its operation in it, or links none."""
    from k8s_bridge.actuator import runner

    exp, op, task = _create_task(monkeypatch)
    found = runner.operation_of(task)
    assert found is not None and (found.id, found.done) == (op.id, False)
    for name in (f"experiments/{exp.id}/workUnits/1/operations/{op.id}\n",  # a "$" would take the newline
                 f"experiments/{exp.id}/workUnits/1/operations/{op.id:d}".replace("1/", "\u0661/"),  # Arabic one
                 f"experiments/{exp.id}/workUnits/1/operations/{2**63}",  # past any id: no query at all
                 f"experiments/{exp.id}/workUnits/2/operations/{op.id}",  # another unit's
                 "operations/1", ""):
        task.operation_name = name
        assert runner.operation_of(task) is None, name


def test_it_marks_dispatched_only_when_the_broker_took_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = factories.experiment()
    op_id = services.create_work_unit(exp.id, factories.work_unit_message()).id

    def refuse(task: task_pb2.Task, **_: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr("workunits.outbox.publish", refuse)
    REAL_DELIVER([op_id])
    row = Operation.objects.get(id=op_id)
    assert row.dispatched_time is None and row.dispatch_attempts == 1

    sent: list[task_pb2.Task] = []
    monkeypatch.setattr("workunits.outbox.publish", lambda task, **_: sent.append(task))
    REAL_DELIVER([op_id])
    row = Operation.objects.get(id=op_id)
    assert row.dispatched_time is not None and len(sent) == 1


def test_it_signs_what_it_publishes(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, list[str], dict[str, Any]]] = []
    monkeypatch.setattr(app, "send_task", lambda name, args, **kw: sent.append((name, args, kw)))
    exp = factories.experiment()
    op = Operation.objects.select_related("work_unit").get(
        id=services.create_work_unit(exp.id, factories.work_unit_message()).id)
    outbox.publish(outbox.build_task(op))
    [(name, [payload], options)] = sent
    assert name == "xmc.actuator.create"
    task_wire.verify(task_wire.decode_task(payload))
    # Logs and monitors show the operation, not the base64 payload.
    assert options["argsrepr"] == f"({op.name!r},)"


def test_it_marks_everything_one_delivery_sent_in_one_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = factories.experiment()
    ids = [services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(3)]
    sent: list[task_pb2.Task] = []
    monkeypatch.setattr("workunits.outbox.publish", lambda task, **_: sent.append(task))
    with CaptureQueriesContext(connection) as queries:
        REAL_DELIVER(ids)
    marks = [q["sql"] for q in queries.captured_queries
             if q["sql"].startswith("UPDATE") and "dispatched_time" in q["sql"].split("WHERE")[0]]
    assert len(sent) == 3 and len(marks) == 1
    assert not Operation.objects.filter(id__in=ids, dispatched_time__isnull=True).exists()
    # A second mark of the same operations changes nothing: the first time counts.
    first = {op.id: op.dispatched_time for op in Operation.objects.filter(id__in=ids)}
    assert services.mark_operations_dispatched(ids) == 0
    assert {op.id: op.dispatched_time for op in Operation.objects.filter(id__in=ids)} == first


def test_it_keeps_one_redis_client_per_channel_in_the_broker_and_still_delivers() -> None:
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, broker.Transport)
        channel = conn.default_channel
        assert channel._create_client() is channel._create_client()
        queue = conn.SimpleQueue(f"xmc-test-broker-{uuid.uuid4().hex}")
        try:
            for n in (1, 2):
                queue.put({"n": n})
            got = []
            for _ in range(2):
                message = queue.get(timeout=5)
                got.append(message.payload["n"])
                message.ack()
            assert got == [1, 2]
        finally:
            queue.clear()
            queue.close()


def test_it_tells_a_stopping_execution_with_an_error_when_the_delete_cannot_be_sent(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    monkeypatch.setattr("workunits.outbox.publish", lambda task, **_: (_ for _ in ()).throw(ConnectionError("down")))
    exp = factories.experiment()
    services.create_work_unit(exp.id, factories.work_unit_message())
    stop = services.stop_work_units(exp.id, [1], batch=False).id
    for _ in range(settings.XMC_OUTBOX_FAILURES_BEFORE_MESSAGE):
        REAL_DELIVER([stop])
    ex = WorkUnitExecution.objects.get(work_unit__experiment_id=exp.id, eid=1)
    assert ex.system_message["severity"] == "ERROR"
    assert ex.state == "STOPPING"


def test_it_sweeps_what_never_left_and_what_outlived_its_lease_without_a_live_claim(
    delivered: list[list[int]], settings: Any
) -> None:
    settings.XMC_OUTBOX_SWEEP_MIN_AGE_S = 60
    settings.XMC_OPERATION_LEASE_S = 45
    exp = factories.experiment()
    old, young, lost, fresh, claimed, expired_claim, done = (
        services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(7))
    now = timezone.now()
    long_ago = now - timedelta(minutes=5)
    Operation.objects.exclude(id=young).update(create_time=long_ago)
    # Sent 5 minutes ago, never claimed: the message was lost (Redis restarted empty).
    Operation.objects.filter(id__in=[lost, claimed, expired_claim, done]).update(dispatched_time=long_ago)
    # Sent 10 s ago: still within its lease (a worker may not have reached it yet).
    Operation.objects.filter(id=fresh).update(dispatched_time=now - timedelta(seconds=10))
    # A worker holds it (a Restart waiting for the old JobSet): never re-sent under it.
    Operation.objects.filter(id=claimed).update(claimed_until=now + timedelta(seconds=30), claimed_by="w1")
    # The worker that held it died: its claim ran out.
    Operation.objects.filter(id=expired_claim).update(claimed_until=now - timedelta(seconds=1), claimed_by="w2")
    services.complete_operation(done)
    delivered.clear()
    assert delivery_tasks.sweep()["operations"] == 3
    assert sorted(delivered[0]) == sorted([old, lost, expired_claim])


def test_it_restarts_the_lease_on_a_resend(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    exp = factories.experiment()
    op_id = services.create_work_unit(exp.id, factories.work_unit_message()).id
    long_ago = timezone.now() - timedelta(minutes=5)
    Operation.objects.filter(id=op_id).update(create_time=long_ago, dispatched_time=long_ago)
    monkeypatch.setattr("workunits.outbox.publish", lambda task, **_: None)
    REAL_DELIVER([op_id])  # the sweep's path
    row = Operation.objects.get(id=op_id)
    assert row.dispatched_time is not None and row.dispatched_time > long_ago
    assert not outbox.due_operations(timezone.now()).filter(id=op_id).exists()
    later = timezone.now() + timedelta(seconds=settings.XMC_OPERATION_LEASE_S + 1)
    assert outbox.due_operations(later).filter(id=op_id).exists()


def test_it_resends_only_deletes_while_paused(delivered: list[list[int]]) -> None:
    from workunits import scheduling

    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    services.create_work_unit(exp.id, factories.work_unit_message())
    stop = services.stop_work_units(exp.id, [2], batch=False).id
    long_ago = timezone.now() - timedelta(minutes=5)
    Operation.objects.filter(id__in=[create, stop]).update(create_time=long_ago, dispatched_time=long_ago)
    Operation.objects.exclude(id__in=[create, stop]).update(done=True)
    scheduling.pause(reason="maintenance", by="ops@example.com")
    delivered.clear()
    assert delivery_tasks.sweep()["operations"] == 1 and delivered == [[stop]]  # the held Create waits for resumption
    scheduling.resume(by="ops@example.com", dispatch=False)
    delivered.clear()
    assert delivery_tasks.sweep()["operations"] == 2


def test_it_purges_done_operations_after_the_retention(settings: Any) -> None:
    exp = factories.experiment()
    old, recent, pending = (services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(3))
    for op_id in (old, recent):
        services.complete_operation(op_id)
    now = timezone.now()
    Operation.objects.filter(id=old).update(end_time=now - timedelta(days=91))
    Operation.objects.filter(id=recent).update(end_time=now - timedelta(days=89))
    Operation.objects.filter(id=pending).update(create_time=now - timedelta(days=200))
    assert tasks.purge_operations() == 1
    assert set(Operation.objects.filter(id__in=[old, recent, pending]).values_list("id", flat=True)) == {recent, pending}


def test_it_schedules_both_sweeps_on_beat() -> None:
    app.loader.import_default_modules()
    queues = {entry["task"]: entry["options"]["queue"] for entry in app.conf.beat_schedule.values()}
    assert queues == {"xmc.actuator.purge_operations": "actuator",
                      "xmc.resumption.cleanup": "resumption", "xmc.delivery.sweep": "actuator",
                      "xmc.delivery.purge": "actuator", "xmc.notifications.sweep": "notifications",
                      "xmc.logs.purge_archive": "actuator", "xmc.metrics.maintain_partitions": "actuator",
                      "xmc.studies.tick": "lifecycle", "xmc.metrics.collect_system": "actuator",
                      "xmc.metrics.roll_up_blocks": "actuator",
                      "xmc.usage.settle": "actuator"}
    registered = set(app.tasks)
    assert set(queues) <= registered  # every scheduled name is a task a worker knows
