"""Each handler and precondition against the simulator, through the real client.

Tasks run in-process with ``Task.apply`` (the same code a worker runs);
the queue paths themselves are covered by test_worker.py.
"""
from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import any_pb2

from core import errors as service_errors
from core import pb, task_wire
from core.protos import task_pb2
from jobsets.builder import build_jobset
from jobsets.contract import Stamp, jobset_name
from k8s_bridge import client, tasks
from k8s_bridge.actuator import handlers
from k8s_bridge.errors import ActuatorError
from tests import factories
from tests.k8s_bridge.actuator.conftest import NAMESPACE, get_jobset
from workunits import outbox, services
from workunits.models import DeadLetter, Operation

pytestmark = pytest.mark.django_db


def payload_for(op_id: int, change: Any = None) -> str:
    op = Operation.objects.select_related("work_unit").get(id=op_id)
    task = outbox.build_task(op)
    if change is not None:
        change(task)
    task_wire.sign(task)
    return task_wire.encode_task(task)


def run(op_id: int, change: Any = None) -> None:
    op = Operation.objects.get(id=op_id)
    task_fn = {"CREATE": tasks.create, "DELETE": tasks.delete, "RESTART": tasks.restart, "UPDATE": tasks.update}
    result = task_fn[op.task_type].apply(args=[payload_for(op_id, change)])
    if result.failed():
        raise result.result


def op(op_id: int) -> Operation:
    return Operation.objects.get(id=op_id)


def new_work_unit() -> tuple[int, int]:
    exp = factories.experiment()
    created = services.create_work_unit(exp.id, factories.work_unit_message())
    return exp.id, created.id


def test_it_creates_once_when_the_same_task_arrives_twice(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    run(create)
    first = get_jobset(api_cluster, xid, 1)
    end_time = op(create).end_time
    run(create)
    assert get_jobset(api_cluster, xid, 1)["metadata"]["uid"] == first["metadata"]["uid"]
    assert op(create).end_time == end_time


def test_it_treats_already_exists_with_our_labels_as_success(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    run(create)
    Operation.objects.filter(id=create).update(done=False, end_time=None, response=None)  # a lost ack
    run(create)
    assert op(create).done and op(create).error is None


def test_it_refuses_to_adopt_a_foreign_jobset_with_our_name(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    foreign = build_jobset(factories.executable(), Stamp(xid=xid, wid=99, eid=1, last_edit_ns=1), namespace=NAMESPACE)
    foreign["metadata"]["name"] = jobset_name(xid, 1)
    client.custom_objects().create_namespaced_custom_object(
        client.JOBSET_GROUP, client.JOBSET_VERSION, NAMESPACE, client.JOBSET_PLURAL, foreign)
    run(create)
    finished = op(create)
    assert finished.done and finished.error["code"] == 9  # FAILED_PRECONDITION
    letter = DeadLetter.objects.get(operation_id=create)
    assert letter.error_code == "FAILED_PRECONDITION"
    assert get_jobset(api_cluster, xid, 1)["metadata"]["labels"]["xmc.google.com/wid"] == "99"


def test_it_skips_a_create_whose_stop_ran_first(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    stop = services.stop_work_units(xid, [1], batch=False).id
    run(stop)  # Delete before Create: nothing to delete yet
    assert op(stop).done and op(stop).error is None
    run(create)
    assert op(create).done and op(create).error is None
    assert get_jobset(api_cluster, xid, 1) is None


def test_it_deletes_only_up_to_the_target_eid(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    run(create)
    stop = services.stop_work_units(xid, [1], batch=False).id
    # A JobSet of a newer execution holds the name: the stop of eid 1 is superseded.
    client.custom_objects().patch_namespaced_custom_object(
        client.JOBSET_GROUP, client.JOBSET_VERSION, NAMESPACE, client.JOBSET_PLURAL, jobset_name(xid, 1),
        {"metadata": {"labels": {"xmc.google.com/execution-id": "2"}}})
    run(stop)
    assert op(stop).done and op(stop).error is None
    assert not get_jobset(api_cluster, xid, 1)["metadata"].get("deletionTimestamp")


def test_it_refuses_a_delete_older_than_the_jobsets_last_edit(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    run(create)
    stop = services.stop_work_units(xid, [1], batch=False).id
    run(stop, change=lambda t: setattr(t, "operation_time_ns", 1))
    assert op(stop).error["code"] == 9
    assert not get_jobset(api_cluster, xid, 1)["metadata"].get("deletionTimestamp")
    assert DeadLetter.objects.filter(operation_id=stop, error_code="FAILED_PRECONDITION").exists()


def test_it_never_deletes_a_newer_object_with_the_same_name(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    run(create)
    old = get_jobset(api_cluster, xid, 1)
    api = client.custom_objects()
    api.patch_namespaced_custom_object(client.JOBSET_GROUP, client.JOBSET_VERSION, NAMESPACE, client.JOBSET_PLURAL,
                                       jobset_name(xid, 1), {"metadata": {"finalizers": None}})
    api.delete_namespaced_custom_object(client.JOBSET_GROUP, client.JOBSET_VERSION, NAMESPACE, client.JOBSET_PLURAL,
                                        jobset_name(xid, 1))
    Operation.objects.filter(id=create).update(done=False)
    run(create)  # a newer object, same name
    with pytest.raises(client.ApiException) as info:
        handlers._delete(old)
    assert info.value.status == 409
    assert get_jobset(api_cluster, xid, 1)["metadata"]["uid"] != old["metadata"]["uid"]


def test_it_finishes_a_restart_redelivered_after_the_new_jobset_exists(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    restart = services.restart_work_units(xid, [1], batch=False).id
    run(restart)  # nothing in the way: creates eid 2 directly
    js = get_jobset(api_cluster, xid, 1)
    assert js["metadata"]["labels"]["xmc.google.com/execution-id"] == "2"
    Operation.objects.filter(id=restart).update(done=False)
    run(restart)
    assert op(restart).done
    assert get_jobset(api_cluster, xid, 1)["metadata"]["uid"] == js["metadata"]["uid"]
    run(create)  # the old create arrives last: eid 1 is no longer current
    assert get_jobset(api_cluster, xid, 1)["metadata"]["uid"] == js["metadata"]["uid"]


def test_it_deletes_the_old_jobset_and_waits_before_restarting(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    run(create)
    restart_id = services.restart_work_units(xid, [1], batch=False).id
    task = task_wire.decode_task(payload_for(restart_id))
    with pytest.raises(handlers.RetryLater):
        handlers.handle_restart(task, restart_id)
    assert get_jobset(api_cluster, xid, 1)["metadata"].get("deletionTimestamp")
    assert not op(restart_id).done


def test_it_patches_notify_when_and_retries_only_a_missing_jobset(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    task = task_pb2.Task(type=task_pb2.Task.UPDATE, xid=xid, wid=1, eid=1, notify_when="COMPLETED")
    task.update_mask.paths.append(task_wire.NOTIFY_WHEN_PATH)
    with pytest.raises(ActuatorError) as info:
        handlers.handle_update(task, None)
    assert info.value.code == "UNAVAILABLE"  # retryable
    run(create)
    handlers.handle_update(task, None)
    assert get_jobset(api_cluster, xid, 1)["metadata"]["annotations"]["xmc.google.com/notify-when"] == "COMPLETED"
    task.notify_when = ""
    handlers.handle_update(task, None)
    assert "xmc.google.com/notify-when" not in (get_jobset(api_cluster, xid, 1)["metadata"].get("annotations") or {})


def test_it_dead_letters_a_permanent_error_with_the_operation_done(api_cluster: Any) -> None:
    xid, create = new_work_unit()

    def not_a_work_unit(task: task_pb2.Task) -> None:
        task.work_unit.CopyFrom(any_pb2.Any())
        task.work_unit.Pack(pb.work_unit.Executable())

    run(create, change=not_a_work_unit)
    assert op(create).error["code"] == 3
    assert DeadLetter.objects.get(operation_id=create).error_code == "INVALID_ARGUMENT"
    assert get_jobset(api_cluster, xid, 1) is None


def test_it_dead_letters_after_the_last_retry(api_cluster: Any, settings: Any) -> None:
    settings.XMC_ACTUATOR_MAX_RETRIES = 0
    settings.KUBECONFIG = str(api_cluster.kubeconfig_path) + ".closed"
    kubeconfig = open(str(api_cluster.kubeconfig_path)).read().replace(api_cluster.url, "http://127.0.0.1:9")
    with open(settings.KUBECONFIG, "w") as f:
        f.write(kubeconfig)
    client.reset()
    xid, create = new_work_unit()
    run(create)
    assert op(create).error["code"] == 14  # UNAVAILABLE, after the retries ran out
    assert DeadLetter.objects.get(operation_id=create).error_code == "UNAVAILABLE"


def test_it_cancels_a_pending_create_that_has_not_run(api_cluster: Any, _no_outbox_delivery: Any) -> None:
    xid, create = new_work_unit()
    services.request_operation_cancellation(create)
    run(create)
    finished = op(create)
    assert finished.done and finished.error["code"] == 1  # CANCELLED
    assert get_jobset(api_cluster, xid, 1) is None


def test_it_cancels_before_sending_when_asked_in_time(api_cluster: Any, monkeypatch: pytest.MonkeyPatch,
                                                     real_deliver: None) -> None:
    sent: list[Any] = []
    monkeypatch.setattr("workunits.outbox.publish", lambda task, **_: sent.append(task))
    xid, create = new_work_unit()
    services.request_operation_cancellation(create)
    outbox.deliver([create])
    assert sent == []
    assert op(create).error["code"] == 1


def test_it_ignores_a_cancellation_that_comes_after_the_create(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    run(create)
    services.request_operation_cancellation(create)
    assert op(create).error is None and get_jobset(api_cluster, xid, 1) is not None


def test_it_completes_a_batch_parent_when_its_last_child_is_done(api_cluster: Any) -> None:
    exp = factories.experiment()
    creates = [services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(2)]
    for c in creates:
        run(c)
    parent = services.stop_work_units(exp.id, None, batch=True)
    children = list(Operation.objects.filter(parent=parent).order_by("id").values_list("id", flat=True))
    run(children[0])
    assert not op(parent.id).done
    run(children[1])
    finished = op(parent.id)
    assert finished.done and finished.response["@type"].endswith("ListWorkUnitsResponse")


def test_it_refuses_an_invalid_executable_at_create_work_unit_naming_the_field() -> None:
    exp = factories.experiment()
    message = factories.work_unit_message(host_network=True)
    with pytest.raises(service_errors.InvalidArgument) as info:
        services.create_work_unit(exp.id, message)
    assert info.value.field == "work_unit.executable.jobset.jobs[0].host_network"


def test_it_cancels_a_pending_restart_without_touching_the_running_jobset(api_cluster: Any) -> None:
    xid, create = new_work_unit()
    run(create)
    uid = get_jobset(api_cluster, xid, 1)["metadata"]["uid"]
    restart = services.restart_work_units(xid, [1], batch=False).id
    services.request_operation_cancellation(restart)
    run(restart)
    assert op(restart).error["code"] == 1
    js = get_jobset(api_cluster, xid, 1)
    assert js["metadata"]["uid"] == uid and not js["metadata"].get("deletionTimestamp")
