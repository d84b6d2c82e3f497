"""Experiment rows as ``cloud.xmanager.v1`` messages, and messages as row fields.

The one place the Experiment wire shape is decided (gRPC, REST and the admin
use it); the generic helpers are in ``core.convert``.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core import limits, pb
from core.convert import enum_name, from_json, parse_list, set_if, timestamp, to_json
from core.errors import InvalidArgument
from experiments.models import Experiment

WorkUnitState = pb.status.WorkUnitStatus.WorkUnitState


def experiment_status_to_proto(exp: Experiment) -> pb.status.ExperimentStatus:
    status = pb.status.ExperimentStatus(
        active_state=pb.status.ExperimentStatus.ActiveState.Value(exp.active_state),
        launch_state=pb.status.ExperimentStatus.LaunchState.Value(exp.launch_state),
        launch_id=exp.launch_id,
    )
    for state in WorkUnitState.keys():
        count = int(exp.child_state_counts.get(state, 0))
        if count:
            status.child_state_counts.add(state=WorkUnitState.Value(state), count=count)
    for severity in pb.structured_message.StructuredMessage.Severity.keys():
        count = int(exp.message_severity_counts.get(severity, 0))
        if count:
            status.message_severity_counts.add(
                severity=pb.structured_message.StructuredMessage.Severity.Value(severity), count=count
            )
    set_if(status, "last_child_status_update_time", timestamp(exp.last_child_status_update_time))
    set_if(status, "update_time", timestamp(exp.status_update_time))
    if exp.structured_status_message:
        status.structured_status_message.CopyFrom(
            from_json(pb.structured_message.StructuredMessage, exp.structured_status_message)
        )
    return status


def experiment_to_proto(exp: Experiment) -> pb.experiment.Experiment:
    message = pb.experiment.Experiment(
        name=exp.name,
        title=exp.title,
        creator=exp.creator,
        priority=pb.priority.Priority.Value(exp.priority),
        tags=list(exp.tags),
        notes=exp.notes,
    )
    message.acls.CopyFrom(from_json(pb.xid.XidAcls, exp.acls))
    set_if(message, "create_time", timestamp(exp.create_time))
    set_if(message, "update_time", timestamp(exp.update_time))
    set_if(message, "complete_time", timestamp(exp.complete_time))
    message.status.CopyFrom(experiment_status_to_proto(exp))
    message.urls.extend(parse_list(pb.url.Url, exp.urls))
    message.resources.extend(parse_list(pb.resources.ResourceSet, exp.resources))
    return message


#: Experiment fields a client may set (CreateExperiment) or name in an update mask.
EXPERIMENT_MUTABLE = ("title", "acls", "priority", "tags", "notes", "urls", "resources")


def experiment_fields(message: pb.experiment.Experiment, paths: Iterable[str]) -> dict[str, Any]:
    """Model field values for the given top-level paths of an Experiment message."""
    fields: dict[str, Any] = {}
    for path in paths:
        if path == "title":
            fields["title"] = message.title
        elif path == "acls":
            fields["acls"] = to_json(message.acls)
        elif path == "priority":
            fields["priority"] = enum_name(pb.priority.Priority, message.priority, field="experiment.priority")
        elif path == "tags":
            fields["tags"] = list(message.tags)
        elif path == "notes":
            fields["notes"] = message.notes
        elif path == "urls":
            fields["urls"] = [to_json(u) for u in message.urls]
        elif path == "resources":
            fields["resources"] = [to_json(r) for r in message.resources]
        else:
            raise InvalidArgument(
                f"update_mask path {path!r} is not an updatable Experiment field; allowed: "
                f"{', '.join(EXPERIMENT_MUTABLE)}",
                field="update_mask",
            )
    limits.check_fields(fields, "experiment")
    return fields


