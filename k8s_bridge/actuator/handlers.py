"""One handler per task type; each re-reads the world before it acts.

A handler receives a verified Task and the id of its Operation row. It reads
the execution (``workunits`` rows) and the JobSet, applies the pure rules of
``preconditions``, makes at most one cluster change per call, and records the
outcome on the Operation only (``workunits.services.complete_operation``):
never an execution state. Waiting (Restart: until the old JobSet is gone) is
``RetryLater``, which the runner turns into a Celery retry with backoff; a
worker never sleeps.
"""
from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from core import pb, task_wire
from core.protos import task_pb2
from jobsets.builder import build_jobset
from jobsets.contract import ANNOTATION_NOTIFY_WHEN, Stamp, jobset_name
from k8s_bridge import client
from k8s_bridge.actuator import preconditions
from k8s_bridge.actuator.preconditions import Decision, ExecutionView
from k8s_bridge.errors import ActuatorError
from metrics import tokens as metrics_tokens
from workunits import services
from workunits.models import WorkUnitExecution

log = logging.getLogger(__name__)

NOTIFY_WHEN_PATH = task_wire.NOTIFY_WHEN_PATH
UPDATABLE_PATHS = frozenset({NOTIFY_WHEN_PATH})


class RetryLater(Exception):
    """Not an error: the world is not ready yet (a deletion in progress)."""


# --- Reads --------------------------------------------------------------------------------


def read_execution(xid: int, wid: int, eid: int) -> ExecutionView | None:
    """The execution ``eid`` and its work unit's current eid (one query; None when gone)."""
    row = (
        WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid, eid=eid)
        .values("state", "work_unit__current_eid").first()
    )
    if row is None:
        return None
    return ExecutionView(current_eid=int(row["work_unit__current_eid"]), state=str(row["state"]))


def read_jobset(xid: int, wid: int) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = client.custom_objects().get_namespaced_custom_object(
            client.JOBSET_GROUP, client.JOBSET_VERSION, settings.XMC_K8S_NAMESPACE, client.JOBSET_PLURAL,
            jobset_name(xid, wid),
        )
        return obj
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _create(manifest: dict[str, Any]) -> None:
    client.custom_objects().create_namespaced_custom_object(
        client.JOBSET_GROUP, client.JOBSET_VERSION, settings.XMC_K8S_NAMESPACE, client.JOBSET_PLURAL, manifest,
    )


def _delete(jobset: dict[str, Any]) -> None:
    """Delete exactly this object: a UID precondition spares a newer one with the same name."""
    meta = jobset["metadata"]
    try:
        client.custom_objects().delete_namespaced_custom_object(
            client.JOBSET_GROUP, client.JOBSET_VERSION, settings.XMC_K8S_NAMESPACE, client.JOBSET_PLURAL,
            meta["name"], body={"preconditions": {"uid": meta["uid"]}, "propagationPolicy": "Background"},
        )
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def _work_unit(task: task_pb2.Task) -> pb.work_unit.WorkUnit:
    message = pb.work_unit.WorkUnit()
    if not task.work_unit.Unpack(message):
        raise ActuatorError("INVALID_ARGUMENT", f"task work_unit is a {task.work_unit.type_url!r}, not a WorkUnit")
    return message


def _manifest(task: task_pb2.Task) -> dict[str, Any]:
    work_unit = _work_unit(task)
    priority = pb.priority.Priority.Name(work_unit.priority) if work_unit.priority else ""
    stamp = Stamp(xid=task.xid, wid=task.wid, eid=task.eid, last_edit_ns=task.operation_time_ns,
                  notify_when=task.notify_when, priority=priority,
                  env=metrics_tokens.execution_env(task.xid, task.wid, task.eid))
    return build_jobset(work_unit.executable, stamp, namespace=settings.XMC_K8S_NAMESPACE)


def _complete(operation_id: int | None, **kwargs: Any) -> None:
    if operation_id is not None:
        services.complete_operation(operation_id, **kwargs)


# --- Create --------------------------------------------------------------------------------


def _create_or_verify(task: task_pb2.Task, manifest: dict[str, Any]) -> None:
    try:
        _create(manifest)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        existing = read_jobset(task.xid, task.wid)
        if existing is None:
            raise  # gone again in between: retryable (409 Conflict)
        preconditions.verify_duplicate_jobset(existing, task.xid, task.wid, task.eid)


def _undo_if_overtaken(task: task_pb2.Task) -> None:
    """A Stop (or Restart) committed while we were creating: its Delete may already
    have found nothing to delete, so take back the JobSet we just made."""
    if preconditions.execution_skip_reason(read_execution(task.xid, task.wid, task.eid), task.eid) is None:
        return
    created = read_jobset(task.xid, task.wid)
    if created is not None and preconditions.identity_matches(created, task.xid, task.wid, task.eid):
        log.info("actuator.create.undone", extra={"xid": task.xid, "wid": task.wid, "eid": task.eid})
        _delete(created)


def handle_create(task: task_pb2.Task, operation_id: int | None) -> None:
    skip = preconditions.execution_skip_reason(read_execution(task.xid, task.wid, task.eid), task.eid)
    if skip is not None:
        log.info("actuator.create.skipped", extra={"xid": task.xid, "wid": task.wid, "reason": skip})
        _complete(operation_id)
        return
    manifest = _manifest(task)
    _create_or_verify(task, manifest)
    _undo_if_overtaken(task)
    _complete(operation_id)


# --- Delete --------------------------------------------------------------------------------


def handle_delete(task: task_pb2.Task, operation_id: int | None) -> None:
    jobset = read_jobset(task.xid, task.wid)
    decision = preconditions.removal_decision(jobset, task.target_eid, task.operation_time_ns)
    if decision == Decision.ACT:
        assert jobset is not None
        _delete(jobset)
    # DONE / SUPERSEDED / WAIT (a deletion already under way, the finalizer path
    # writes STOPPED): the stop has been carried out as far as the actuator goes.
    _complete(operation_id)


# --- Restart -------------------------------------------------------------------------------


def handle_restart(task: task_pb2.Task, operation_id: int | None) -> None:
    skip = preconditions.execution_skip_reason(read_execution(task.xid, task.wid, task.eid), task.eid)
    if skip is not None:
        log.info("actuator.restart.skipped", extra={"xid": task.xid, "wid": task.wid, "reason": skip})
        _complete(operation_id)
        return
    manifest = _manifest(task)  # validate before removing anything
    jobset = read_jobset(task.xid, task.wid)
    decision = preconditions.restart_decision(jobset, task.eid, task.target_eid, task.operation_time_ns)
    if decision == Decision.DONE:
        _complete(operation_id)
        return
    if decision == Decision.WAIT:
        assert jobset is not None
        if preconditions.removal_decision(jobset, task.target_eid, task.operation_time_ns) == Decision.ACT:
            _delete(jobset)
        raise RetryLater(f"waiting for JobSet {jobset['metadata']['name']} (eid {task.target_eid}) to be gone")
    try:
        _create_or_verify(task, manifest)
    except ActuatorError:
        # The name is taken by an older execution that reappeared between our
        # read and create: go round again (delete it, wait, create).
        again = read_jobset(task.xid, task.wid)
        if again is not None and preconditions.restart_decision(
                again, task.eid, task.target_eid, task.operation_time_ns) == Decision.WAIT:
            raise RetryLater("an older JobSet holds the name") from None
        raise
    _undo_if_overtaken(task)
    _complete(operation_id)


# --- Update --------------------------------------------------------------------------------


def handle_update(task: task_pb2.Task, operation_id: int | None) -> None:
    paths = list(task.update_mask.paths)
    preconditions.validate_update_mask(paths, UPDATABLE_PATHS)
    patch: dict[str, Any] = {"metadata": {"annotations": {ANNOTATION_NOTIFY_WHEN: task.notify_when or None}}}
    try:
        client.custom_objects().patch_namespaced_custom_object(
            client.JOBSET_GROUP, client.JOBSET_VERSION, settings.XMC_K8S_NAMESPACE, client.JOBSET_PLURAL,
            jobset_name(task.xid, task.wid), patch,
        )
    except client.ApiException as exc:
        if exc.status == 404:
            # Only here is NotFound retried: the JobSet may not exist yet.
            raise ActuatorError("UNAVAILABLE", f"JobSet {jobset_name(task.xid, task.wid)} does not exist yet") from exc
        raise
    _complete(operation_id)


HANDLERS = {
    task_pb2.Task.CREATE: handle_create,
    task_pb2.Task.DELETE: handle_delete,
    task_pb2.Task.RESTART: handle_restart,
    task_pb2.Task.UPDATE: handle_update,
}
