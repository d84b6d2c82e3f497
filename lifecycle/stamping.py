"""Stamping the notify-when on tasks: which states the rules want for a work unit, kept up to date.

The database half of the notify-when (the format is ``lifecycle.notify_when``'s):

* :func:`notify_when_for`: the union of the states the rules in force want
  for the work unit's artifacts, registered as the notify-when provider of
  ``workunits.hooks`` (the outbox and the resumption run stamp it on Create
  and Restart tasks);
* :func:`refresh`: recompute it on a held task before it is re-sent;
* :func:`on_artifact_attached`: registered in ``artifacts.hooks``; when an
  artifact is attached, an UPDATE operation (the outbox row) patches the
  running JobSet's annotation.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from artifacts.models import Artifact
from core.protos import task_pb2
from lifecycle import notify_when, rules
from workunits import services as wu_services

log = logging.getLogger(__name__)


def notify_when_for(xid: int, wid: int) -> str:
    """The union of the states the rules want for this work unit's artifacts ("" = none, or flag off)."""
    if not settings.XMC_ARTIFACT_LIFECYCLE_ENABLED:
        return ""
    registry = rules.registry()
    if not registry:
        return ""
    kinds = set(
        Artifact.objects.filter(experiment_id=xid, work_unit__wid=wid)
        .exclude(payload_kind="")
        .values_list("payload_kind", flat=True)
        .distinct()
    )
    wanted: set[str] = set()
    for rule in registry:
        if kinds & rule.payload_kinds:
            wanted |= rule.wanted_states
    return notify_when.encode(wanted)


def refresh(task: task_pb2.Task) -> task_pb2.Task:
    """Recompute ``task.notify_when`` for a Create or Restart task about to be (re-)sent.

    Resumption calls this before re-signing a paused task: artifacts may have
    been attached while it waited. Other task types are returned unchanged.
    """
    if task.type in (task_pb2.Task.CREATE, task_pb2.Task.RESTART):
        task.notify_when = notify_when_for(task.xid, task.wid)
    return task


def on_artifact_attached(xid: int, wid: int, payload_kind: str) -> None:
    """After an artifact is attached to a work unit: patch its running JobSet's notify-when.

    Called inside the creating transaction. When a rule handles the
    artifact's kind, an UPDATE operation is recorded in that same transaction
    (``workunits.services.record_notify_when_update``: the row is the outbox,
    so a lost message is re-sent by the sweep) unless the work unit's current
    execution has ended. Its notify-when is computed when it is sent, after
    commit, from every artifact committed by then (the actuator retries a
    patch of a JobSet it has not created yet).
    """
    if not settings.XMC_ARTIFACT_LIFECYCLE_ENABLED or not payload_kind:
        return
    try:
        registry = rules.registry()
    except ImproperlyConfigured:
        # Reported at start-up (lifecycle.E001); never fail the user's CreateArtifact over it.
        log.exception("lifecycle.notify_when.misconfigured", extra={"xid": xid, "wid": wid})
        return
    if not any(payload_kind in rule.payload_kinds for rule in registry):
        return
    op = wu_services.record_notify_when_update(xid, wid)
    if op is not None:
        log.info("lifecycle.notify_when.update_recorded", extra={"xid": xid, "wid": wid, "operation": op.id})
