"""Artifact rows as ``cloud.xmanager.v1`` messages, and messages as row fields.

The one place the Artifact wire shape is decided; the generic helpers are in
``core.convert``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

from artifacts.models import Artifact
from artifacts.xprof import xprof_url
from core import limits, pb
from core.convert import enum_name, from_json, set_if, timestamp, to_json
from core.errors import InvalidArgument

ARTIFACT_MUTABLE = (
    "url", "acls", "tags", "notes", "lifecycle_phase", "data_type", "mime_type",
    "additional_info", "payload", "priority",
)


def _site_origin() -> tuple[str, str]:
    parts = urlsplit(settings.XMC_PUBLIC_URL)
    return parts.scheme.lower(), parts.netloc.lower()


def stored_url(url: Mapping[str, Any]) -> dict[str, Any]:
    """An artifact's ``Url`` as it is kept: a link into this site loses its origin.

    The client makes an artifact's default link from ``XMANAGER_UI_URL`` (the
    work unit's page, e.g. ``http://127.0.0.1:8000/experiments/3/workUnits/1``);
    kept absolute it would break the day the site's address changes (another
    port after a restart, a new domain). Kept as ``/experiments/3/workUnits/1``
    and given the configured origin (``XMC_PUBLIC_URL``) again when read
    (`served_url`).
    """
    out = dict(url)
    text = str(out.get("url") or "")
    try:
        parts = urlsplit(text)
    except ValueError:
        return out
    if parts.netloc and (parts.scheme.lower(), parts.netloc.lower()) == _site_origin():
        out["url"] = urlunsplit(("", "", parts.path or "/", parts.query, parts.fragment))
    return out


def served_url(url: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Url`` as read: a site-relative link (see `stored_url`) with the configured origin, built now."""
    out = dict(url)
    text = str(out.get("url") or "")
    if text.startswith("/") and not text.startswith("//"):
        out["url"] = settings.XMC_PUBLIC_URL.rstrip("/") + text
    return out


def artifact_to_proto(a: Artifact) -> pb.artifact.Artifact:
    message = pb.artifact.Artifact(
        name=a.name,
        parent=a.parent,
        tags=list(a.tags),
        notes=a.notes,
        lifecycle_phase=pb.artifact.Artifact.LifecyclePhase.Value(a.lifecycle_phase),
        data_type=pb.artifact.Artifact.DataType.Value(a.data_type),
        mime_type=a.mime_type,
        priority=a.priority,
    )
    message.url.CopyFrom(from_json(pb.url.Url, served_url(a.url or {})))
    message.acls.CopyFrom(from_json(pb.xid.XidAcls, a.acls))
    if a.additional_info:
        message.additional_info.CopyFrom(from_json(pb.artifact.Artifact.AdditionalInfo, a.additional_info))
    if a.payload:
        message.payload.CopyFrom(from_json(pb.artifact.ArtifactPayload, a.payload))
    if a.payload_kind == "managed_xprof":
        message.payload.managed_xprof.xprof.xprof_url = xprof_url(a)
    set_if(message, "create_time", timestamp(a.create_time))
    set_if(message, "update_time", timestamp(a.update_time))
    return message


def artifact_fields(message: pb.artifact.Artifact, paths: Iterable[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for path in paths:
        if path == "url":
            fields["url"] = stored_url(to_json(message.url))
        elif path == "acls":
            fields["acls"] = to_json(message.acls)
        elif path == "tags":
            fields["tags"] = list(message.tags)
        elif path == "notes":
            fields["notes"] = message.notes
        elif path == "lifecycle_phase":
            fields["lifecycle_phase"] = (
                enum_name(pb.artifact.Artifact.LifecyclePhase, message.lifecycle_phase,
                          field="artifact.lifecycle_phase", allow_unspecified=True)
                if message.lifecycle_phase else "INPUT"
            )
        elif path == "data_type":
            fields["data_type"] = enum_name(pb.artifact.Artifact.DataType, message.data_type,
                                            field="artifact.data_type", allow_unspecified=True)
        elif path == "mime_type":
            fields["mime_type"] = message.mime_type
        elif path == "additional_info":
            fields["additional_info"] = to_json(message.additional_info) if message.HasField("additional_info") else None
        elif path == "payload":
            kind = message.payload.WhichOneof("type") if message.HasField("payload") else None
            fields["payload"] = to_json(message.payload) if kind else None
            fields["payload_kind"] = kind or ""
        elif path == "priority":
            fields["priority"] = message.priority
        else:
            raise InvalidArgument(
                f"update_mask path {path!r} is not an updatable Artifact field; allowed: "
                f"{', '.join(ARTIFACT_MUTABLE)}",
                field="update_mask",
            )
    limits.check_fields(fields, "artifact")
    return fields
