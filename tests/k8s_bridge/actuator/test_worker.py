"""The actuator end to end: services -> outbox -> Redis -> a real worker -> the simulator."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import close_old_connections

from core import task_wire
from core.protos import task_pb2
from tests import factories
from tests.k8s_bridge.actuator.conftest import Workers, get_jobset, release_finalizer
from tests.waiting import eventually
from workunits import outbox, services
from workunits.models import DeadLetter, Operation

pytestmark = pytest.mark.django_db(transaction=True)


def done(op_id: int) -> Operation | None:
    close_old_connections()
    op = Operation.objects.get(id=op_id)
    return op if op.done else None


def test_it_creates_the_jobset_of_a_new_work_unit_and_reports_the_operation_done(worker: Any, api_cluster: Any) -> None:
    exp = factories.experiment()
    op = services.create_work_unit(exp.id, factories.work_unit_message())
    finished = eventually(lambda: done(op.id), what="the create operation")
    assert finished.error is None
    assert finished.response["@type"].endswith("cloud.xmanager.v1.WorkUnit")
    assert finished.dispatched_time is not None
    jobset = get_jobset(api_cluster, exp.id, 1)
    assert jobset is not None
    assert jobset["metadata"]["labels"]["xmc.google.com/execution-id"] == "1"


def test_it_stops_and_restarts_through_the_worker(worker: Any, api_cluster: Any) -> None:
    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message())
    eventually(lambda: done(create.id), what="create")
    first_uid = get_jobset(api_cluster, exp.id, 1)["metadata"]["uid"]

    restart = services.restart_work_units(exp.id, [1], batch=False)
    # The old JobSet is deleted; our finalizer holds it until the reconciler's
    # finalizer path releases it (done here by hand).
    eventually(lambda: (get_jobset(api_cluster, exp.id, 1) or {}).get("metadata", {}).get("deletionTimestamp"),
               what="deletion of eid 1")
    assert done(restart.id) is None  # waiting, by retries, for eid 1 to be gone
    release_finalizer(api_cluster, exp.id, 1)
    eventually(lambda: done(restart.id), what="restart")
    jobset = get_jobset(api_cluster, exp.id, 1)
    assert jobset["metadata"]["uid"] != first_uid
    assert jobset["metadata"]["labels"]["xmc.google.com/execution-id"] == "2"

    stop = services.stop_work_units(exp.id, [1], batch=False)
    eventually(lambda: done(stop.id), what="stop")
    assert get_jobset(api_cluster, exp.id, 1)["metadata"].get("deletionTimestamp")


def _signed_create(op: Operation) -> task_pb2.Task:
    task = outbox.build_task(op)
    task_wire.sign(task)
    return task


@pytest.mark.parametrize("damage", ["tampered", "expired", "unknown_key", "unsigned"])
def test_it_dead_letters_a_bad_task_and_never_touches_the_cluster(
    workers: Workers, api_cluster: Any, damage: str, _no_outbox_delivery: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operation is committed but not sent: the test sends a damaged task itself.
    monkeypatch.setattr("workunits.outbox.deliver_committed", lambda ops, notify_when=None: None)
    exp = factories.experiment()
    op = services.create_work_unit(exp.id, factories.work_unit_message())
    task = _signed_create(Operation.objects.select_related("work_unit").get(id=op.id))
    if damage == "tampered":
        task.eid = 7
    elif damage == "expired":
        task_wire.sign(task, now_ns=1, ttl_s=1)
    elif damage == "unknown_key":
        task.key_id = "nobody"
    else:
        task.ClearField("signature")
    from xmc.celery import Queue, app

    workers.start(concurrency=1)
    app.send_task(task_wire.ACTUATOR_TASK_NAMES[task.type], args=[task_wire.encode_task(task)], queue=Queue.ACTUATOR.value)
    letter = eventually(lambda: (close_old_connections(), DeadLetter.objects.filter(task_name="xmc.actuator.create").first())[1],
                        what="a dead letter")
    assert letter.error_code == "INVALID_ARGUMENT"
    assert letter.operation_id is None
    assert get_jobset(api_cluster, exp.id, 1) is None
    assert not Operation.objects.get(id=op.id).done
