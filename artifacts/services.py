"""Every write of an Artifact row (CreateArtifact, UpdateArtifact, DeleteArtifact).

Called by the API and the admin, and by the artifact lifecycle
(:func:`set_xprof_url`, fenced on the current execution). Attaching an
artifact to a work unit lets the lifecycle patch the notify-when annotation
of its running JobSet (``artifacts.hooks.on_artifact_attached``, which the
lifecycle registers into).
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from artifacts import hooks
from artifacts.models import Artifact
from artifacts.wire import ARTIFACT_MUTABLE, artifact_fields
from core import pb
from core.errors import InvalidArgument, NotFound
from experiments.models import Experiment
from workunits.models import WorkUnit


def get_artifact(aid: int) -> Artifact:
    try:
        return Artifact.objects.select_related("work_unit").get(id=aid)
    except Artifact.DoesNotExist:
        raise NotFound(f"artifacts/{aid} not found", field="name") from None


def create_artifact(
    xid: int, wid: int | None, message: pb.artifact.Artifact, *, now: datetime | None = None
) -> Artifact:
    """CreateArtifact under an experiment (``wid=None``) or a work unit."""
    fields = artifact_fields(message, ARTIFACT_MUTABLE)
    if message.HasField("payload") and not fields["payload_kind"]:
        raise InvalidArgument("artifact.payload must set one kind", field="artifact.payload")
    if "payload" in fields:
        fields["payload"] = _server_xprof(fields["payload"], None)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        if not Experiment.objects.filter(id=xid).exists():
            raise NotFound(f"experiments/{xid} not found", field="parent")
        work_unit = None
        if wid is not None:
            work_unit = WorkUnit.objects.filter(experiment_id=xid, wid=wid).first()
            if work_unit is None:
                raise NotFound(f"experiments/{xid}/workUnits/{wid} not found", field="parent")
        artifact = Artifact.objects.create(
            experiment_id=xid, work_unit=work_unit, create_time=now, update_time=now, **fields
        )
        if wid is not None:
            hooks.on_artifact_attached(xid, wid, artifact.payload_kind)  # publishes after commit
        return artifact


def update_artifact(
    aid: int, message: pb.artifact.Artifact, paths: Sequence[str], *, now: datetime | None = None
) -> Artifact:
    """UpdateArtifact: replace the masked fields (repeated fields whole)."""
    if not paths:
        raise InvalidArgument("update_mask must name at least one field", field="update_mask")
    fields = artifact_fields(message, paths)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        try:
            artifact = Artifact.objects.select_for_update(no_key=True, of=("self",)).select_related("work_unit").get(id=aid)
        except Artifact.DoesNotExist:
            raise NotFound(f"artifacts/{aid} not found", field="artifact.name") from None
        attached = "payload" in fields and fields["payload_kind"] != artifact.payload_kind
        if "payload" in fields:
            fields["payload"] = _server_xprof(fields["payload"], artifact.payload)
        for name, value in fields.items():
            setattr(artifact, name, value)
        artifact.update_time = now
        artifact.save(update_fields=[*fields, "update_time"])
        if attached and artifact.work_unit is not None:
            # A payload of a newly handled kind is an attach, as far as the lifecycle is concerned.
            hooks.on_artifact_attached(artifact.experiment_id, artifact.work_unit.wid, artifact.payload_kind)
        return artifact


def _server_xprof(payload: dict[str, Any] | None, old: dict[str, Any] | None) -> dict[str, Any] | None:
    """``managed_xprof.xprof`` is OUTPUT_ONLY: keep the server's (``old``), never the client's."""
    if not payload or "managedXprof" not in payload:
        return payload
    out = dict(payload)
    xprof = {k: v for k, v in dict(out["managedXprof"]).items() if k != "xprof"}
    kept = ((old or {}).get("managedXprof") or {}).get("xprof")
    if kept:
        xprof["xprof"] = kept
    out["managedXprof"] = xprof
    return out


def delete_artifact(aid: int) -> None:
    with transaction.atomic(durable=True):
        deleted, _ = Artifact.objects.filter(id=aid).delete()
    if not deleted:
        raise NotFound(f"artifacts/{aid} not found", field="name")


def with_xprof_url(payload: dict[str, Any] | None, url: str) -> dict[str, Any]:
    """``payload`` (proto3 JSON of an ArtifactPayload) with ``managedXprof.xprof.xprofUrl`` set."""
    out = dict(payload or {})
    xprof = dict(out.get("managedXprof") or {})
    xprof["xprof"] = {**dict(xprof.get("xprof") or {}), "xprofUrl": url}
    out["managedXprof"] = xprof
    return out


def set_xprof_url(
    xid: int, wid: int, eid: int, url: str, artifact_ids: Sequence[int], *, now: datetime | None = None
) -> bool:
    """Persist ``url`` as the xprof URL of the work unit's managed xprof artifacts, fenced on the execution.

    One transaction that locks the work unit first (the order of
    ``workunits.services``) and writes only while ``eid`` is its current
    execution; returns False, writing nothing, when a restart superseded it.
    """
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        wu = WorkUnit.objects.select_for_update(no_key=True).filter(experiment_id=xid, wid=wid).first()
        if wu is None or wu.current_eid != eid:
            return False
        rows = (Artifact.objects.select_for_update(no_key=True, of=("self",))
                .filter(id__in=list(artifact_ids), work_unit=wu, payload_kind="managed_xprof").order_by("id"))
        for artifact in rows:
            payload = with_xprof_url(artifact.payload, url)
            if payload != artifact.payload:
                artifact.payload = payload
                artifact.update_time = now
                artifact.save(update_fields=["payload", "update_time"])
        return True
