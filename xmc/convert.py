"""The one conversion module between our models and ``cloud.xmanager.v1`` messages.

Every interface (gRPC, REST, admin display, tasks) turns rows into API
messages and API messages into row fields through these functions, so the
wire shape is decided in one place. Nested messages are stored as proto3
JSON dicts (``to_json`` / ``from_json``); enums are stored by name.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from google.protobuf import any_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message

from xmc import limits, pb
from xmc.errors import InvalidArgument

if TYPE_CHECKING:
    from artifacts.models import Artifact
    from experiments.models import Experiment
    from workunits.models import Operation, StatusMessage, WorkUnit, WorkUnitExecution
    from workunits.state import ExecutionRecord

M = TypeVar("M", bound=Message)

WorkUnitState = pb.status.WorkUnitStatus.WorkUnitState


# --- Generic helpers ------------------------------------------------------------


def to_json(message: Message) -> dict[str, Any]:
    """A message as a proto3 JSON dict (lowerCamelCase names, enums by name)."""
    return json_format.MessageToDict(message)


def from_json(cls: type[M], data: Mapping[str, Any] | None, *, field: str = "") -> M:
    message = cls()
    if data:
        try:
            json_format.ParseDict(dict(data), message)
        except json_format.ParseError as exc:
            raise InvalidArgument(f"{field or cls.DESCRIPTOR.name}: {exc}", field=field or None) from exc
    return message


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def timestamp_from_ns(ns: int | None) -> timestamp_pb2.Timestamp | None:
    if ns is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(ns)
    return ts


def datetime_from_ns(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)


def ns_from_datetime(value: datetime) -> int:
    return int(value.timestamp()) * 1_000_000_000 + value.microsecond * 1000


def enum_name(enum: Any, number: int, *, field: str, allow_unspecified: bool = False) -> str:
    """The stored name of an enum number, or INVALID_ARGUMENT naming ``field``."""
    try:
        name = enum.Name(number)
    except ValueError:
        raise InvalidArgument(f"{field}: {number} is not a valid value", field=field) from None
    if number == 0 and not allow_unspecified:
        raise InvalidArgument(f"{field} must be set (got {name})", field=field)
    return name


def enum_number(enum: Any, name: str) -> int:
    return int(enum.Value(name)) if name else 0


def _set(message: Message, name: str, value: Message | None) -> None:
    if value is not None:
        getattr(message, name).CopyFrom(value)


def _parse_list(cls: type[M], items: Iterable[Mapping[str, Any]]) -> list[M]:
    return [from_json(cls, item) for item in items]


# --- Experiments ------------------------------------------------------------------


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
    _set(status, "last_child_status_update_time", timestamp(exp.last_child_status_update_time))
    _set(status, "update_time", timestamp(exp.status_update_time))
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
    _set(message, "create_time", timestamp(exp.create_time))
    _set(message, "update_time", timestamp(exp.update_time))
    _set(message, "complete_time", timestamp(exp.complete_time))
    message.status.CopyFrom(experiment_status_to_proto(exp))
    message.urls.extend(_parse_list(pb.url.Url, exp.urls))
    message.resources.extend(_parse_list(pb.resources.ResourceSet, exp.resources))
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


# --- Work units and executions ----------------------------------------------------


def execution_record(ex: WorkUnitExecution) -> ExecutionRecord:
    from workunits.state import ExecutionRecord

    return ExecutionRecord(
        state=ex.state,
        state_update_time_ns=ex.state_update_time_ns,
        system_message=ex.system_message,
        user_message=ex.user_message,
        scheduling_information=ex.scheduling_information,
        detailed_status=ex.detailed_status,
        mlrun_url=str((ex.metadata or {}).get("mlrunUrl", "")),
        complete_time_ns=ns_from_datetime(ex.complete_time) if ex.complete_time else None,
    )


def work_unit_status_to_proto(ex: WorkUnitExecution) -> pb.status.WorkUnitStatus:
    status = pb.status.WorkUnitStatus(state=WorkUnitState.Value(ex.state))
    _set(status, "update_time", timestamp(ex.update_time))
    _set(status, "state_update_time", timestamp_from_ns(ex.state_update_time_ns))
    if ex.detailed_status:
        status.detailed_status.CopyFrom(from_json(pb.status.ExecutableStatus, ex.detailed_status))
    for name in ("system_message", "user_message", "scheduling_information"):
        value = getattr(ex, name)
        if value:
            getattr(status, name).CopyFrom(from_json(pb.structured_message.StructuredMessage, value))
    return status


def execution_to_proto(ex: WorkUnitExecution, wu: WorkUnit | None = None) -> pb.work_unit_execution.WorkUnitExecution:
    wu = wu or ex.work_unit
    message = pb.work_unit_execution.WorkUnitExecution(
        name=f"{wu.name}/executions/{ex.eid}",
        state=pb.work_unit_execution.WorkUnitExecution.WorkUnitExecutionState.Value(ex.execution_state),
    )
    _set(message, "create_time", timestamp(ex.create_time))
    _set(message, "update_time", timestamp(ex.update_time))
    _set(message, "complete_time", timestamp(ex.complete_time))
    message.status.CopyFrom(work_unit_status_to_proto(ex))
    message.metadata.CopyFrom(from_json(pb.work_unit_execution.WorkUnitExecutionMetadata, ex.metadata))
    return message


def work_unit_to_proto(wu: WorkUnit, current: WorkUnitExecution | None = None) -> pb.work_unit.WorkUnit:
    message = pb.work_unit.WorkUnit(
        name=wu.name,
        work_unit_type=pb.work_unit.WorkUnit.WorkUnitType.Value(wu.work_unit_type),
        priority=pb.priority.Priority.Value(wu.priority),
        tags=list(wu.tags),
        notes=wu.notes,
    )
    _set(message, "create_time", timestamp(wu.create_time))
    _set(message, "update_time", timestamp(wu.update_time))
    message.urls.extend(_parse_list(pb.url.Url, wu.urls))
    message.executable.MergeFromString(_executable_wire(wu.executable))
    if current is not None:
        message.current_work_unit_execution.CopyFrom(execution_to_proto(current, wu))
    return message


def _executable_wire(data: Mapping[str, Any] | None) -> bytes:
    """A stored executable (proto3 JSON) as wire bytes, parsed once per distinct value.

    Every GetWorkUnit and every Create/Restart task carries the executable;
    ``json_format.ParseDict`` (pure Python) was the largest single cost of a
    GetWorkUnit. The executable of a work unit never changes, so its parse is
    cached per process, keyed by its canonical JSON.
    """
    if not data:
        return b""
    try:
        key = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not plain JSON (an int beyond 64 bits): parse without the cache
        return from_json(pb.work_unit.Executable, data).SerializeToString()
    return _parse_executable(key)


@functools.lru_cache(maxsize=4096)
def _parse_executable(canonical_json: bytes) -> bytes:
    return from_json(pb.work_unit.Executable, orjson.loads(canonical_json)).SerializeToString()


WORK_UNIT_MUTABLE = ("priority", "urls", "tags", "notes")


def work_unit_fields(message: pb.work_unit.WorkUnit, paths: Iterable[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for path in paths:
        if path == "priority":
            fields["priority"] = enum_name(pb.priority.Priority, message.priority, field="work_unit.priority")
        elif path == "urls":
            fields["urls"] = [to_json(u) for u in message.urls]
        elif path == "tags":
            fields["tags"] = list(message.tags)
        elif path == "notes":
            fields["notes"] = message.notes
        else:
            raise InvalidArgument(
                f"update_mask path {path!r} is not an updatable WorkUnit field; allowed: "
                f"{', '.join(WORK_UNIT_MUTABLE)}",
                field="update_mask",
            )
    limits.check_fields(fields, "work_unit")
    return fields


# --- Status messages -----------------------------------------------------------------


def status_message_to_proto(sm: StatusMessage) -> pb.status_message.StatusMessage:
    message = pb.status_message.StatusMessage(name=sm.name, execution_id=sm.execution_id)
    message.content.CopyFrom(from_json(pb.structured_message.StructuredMessage, sm.content))
    return message


# --- Operations ------------------------------------------------------------------------


def operation_metadata_to_proto(op: Operation) -> pb.operations.OperationMetadata:
    metadata = pb.operations.OperationMetadata(
        target=op.target,
        action_type=pb.operations.OperationMetadata.ActionType.Value(op.action_type),
        original_requester=op.original_requester,
        requested_cancellation=op.requested_cancellation,
        cancellation_requester=op.cancellation_requester,
    )
    _set(metadata, "create_time", timestamp(op.create_time))
    _set(metadata, "end_time", timestamp(op.end_time))
    return metadata


def operation_to_proto(op: Operation) -> pb.longrunning.Operation:
    message = pb.longrunning.Operation(name=op.name, done=op.done)
    message.metadata.Pack(operation_metadata_to_proto(op))
    if op.done and op.error:
        message.error.CopyFrom(pb.rpc_status.Status(code=int(op.error.get("code", 2)),
                                                     message=str(op.error.get("message", ""))))
    elif op.done and op.response:
        message.response.CopyFrom(from_json(any_pb2.Any, op.response))
    return message


def packed_json(message: Message) -> dict[str, Any]:
    """``message`` packed in an Any, as proto3 JSON (what Operation.response stores)."""
    packed = any_pb2.Any()
    packed.Pack(message)
    return to_json(packed)


# --- Artifacts ---------------------------------------------------------------------------

ARTIFACT_MUTABLE = (
    "url", "acls", "tags", "notes", "lifecycle_phase", "data_type", "mime_type",
    "additional_info", "payload", "priority",
)


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
    message.url.CopyFrom(from_json(pb.url.Url, a.url))
    message.acls.CopyFrom(from_json(pb.xid.XidAcls, a.acls))
    if a.additional_info:
        message.additional_info.CopyFrom(from_json(pb.artifact.Artifact.AdditionalInfo, a.additional_info))
    if a.payload:
        message.payload.CopyFrom(from_json(pb.artifact.ArtifactPayload, a.payload))
    if a.payload_kind == "managed_xprof":
        from artifacts.xprof import xprof_url  # persisted, else constructed (the read path)

        message.payload.managed_xprof.xprof.xprof_url = xprof_url(a)
    _set(message, "create_time", timestamp(a.create_time))
    _set(message, "update_time", timestamp(a.update_time))
    return message


def artifact_fields(message: pb.artifact.Artifact, paths: Iterable[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for path in paths:
        if path == "url":
            fields["url"] = to_json(message.url)
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
