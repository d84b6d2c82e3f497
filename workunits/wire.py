"""Work unit, execution, status message and operation rows as ``cloud.xmanager.v1`` messages.

The one place their wire shape is decided (gRPC, REST, admin display, the
actuator's tasks); the generic helpers are in ``core.convert``.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from google.protobuf import any_pb2

from core import limits, pb
from core.convert import (
    enum_name,
    from_json,
    ns_from_datetime,
    parse_list,
    set_if,
    timestamp,
    timestamp_from_ns,
    to_json,
)
from core.errors import InvalidArgument
from workunits.models import Operation, StatusMessage, WorkUnit, WorkUnitExecution
from workunits.state import ExecutionRecord

WorkUnitState = pb.status.WorkUnitStatus.WorkUnitState


def execution_record(ex: WorkUnitExecution) -> ExecutionRecord:
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
    set_if(status, "update_time", timestamp(ex.update_time))
    set_if(status, "state_update_time", timestamp_from_ns(ex.state_update_time_ns))
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
    set_if(message, "create_time", timestamp(ex.create_time))
    set_if(message, "update_time", timestamp(ex.update_time))
    set_if(message, "complete_time", timestamp(ex.complete_time))
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
    set_if(message, "create_time", timestamp(wu.create_time))
    set_if(message, "update_time", timestamp(wu.update_time))
    message.urls.extend(parse_list(pb.url.Url, wu.urls))
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
    set_if(metadata, "create_time", timestamp(op.create_time))
    set_if(metadata, "end_time", timestamp(op.end_time))
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
