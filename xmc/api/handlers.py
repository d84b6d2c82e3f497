"""One handler per RPC of ``cloud.xmanager.v1`` and ``google.longrunning.Operations``.

Thin adapters shared by gRPC (``xmc.api.grpc_server``) and REST
(``xmc.api.rest``): each parses resource names, checks the caller's role on
the experiment (``experiments.acl``), calls one service function, and
converts the result with ``core.convert``. Validation happens in the services
and the conversion module before anything is written; errors are
``core.errors.ServiceError`` subclasses naming the field.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from django.conf import settings
from django.db.models import CharField, F, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Cast, Concat, JSONObject
from google.protobuf import empty_pb2

from artifacts import services as artifact_services
from artifacts.models import Artifact
from artifacts.wire import artifact_to_proto
from core import names, pb
from core.errors import InvalidArgument, NotFound
from core.pb import api
from core.pb import longrunning as lro
from experiments import acl
from experiments import services as experiment_services
from experiments.acl import Role
from experiments.models import Experiment
from experiments.wire import experiment_to_proto
from workunits import services as wu_services
from workunits.choices import API_ACTION_TYPES, ExecutionState
from workunits.models import Operation, StatusMessage, WorkUnit, WorkUnitExecution
from workunits.wire import operation_to_proto, status_message_to_proto, work_unit_to_proto
from xmc import listing
from xmc.api import access, reads, waits
from xmc.api.registry import ESS, OPERATIONS, Caller, rpc
from xmc.api.sweep_columns import SweepColumns
from xmc.api.sweep_columns import prepare as prepare_columns
from xmc.listing import FilterField


# --- Resource names: core.names owns their shapes (re-exported for the API's modules) -------

parse_experiment = names.parse_experiment
parse_work_unit = names.parse_work_unit
parse_parent = names.parse_parent
parse_artifact = names.parse_artifact


# --- Access -------------------------------------------------------------------------------


# Permission first (AIP-211): every lookup below answers through xmc.api.access
# (xmc.api.reads for the one-statement reads), so a caller who could not read
# a resource learns nothing about its existence.


def _experiment_acls(xid: int) -> dict[str, Any] | None:
    return Experiment.objects.filter(id=xid).values_list("acls", flat=True).first()


def _experiment(xid: int, caller: Caller, needed: Role, field: str = "name") -> None:
    """PERMISSION_DENIED (NOT_FOUND for staff) unless the caller holds ``needed`` on experiment ``xid``."""
    reads.require_experiment_role(xid, caller.identity, needed, field=field)


def _work_unit(xid: int, wid: int, caller: Caller, needed: Role) -> WorkUnit:
    wu = WorkUnit.objects.select_related("experiment").filter(experiment_id=xid, wid=wid).first()
    name = f"experiments/{xid}/workUnits/{wid}"
    if wu is None:
        raise access.missing_child(caller.identity, _experiment_acls(xid), needed, resource=name)
    access.require(caller.identity, wu.experiment.acls, needed, resource=name)
    return wu


def _requester(caller: Caller) -> wu_services.Requester:
    return wu_services.Requester(email=caller.email, asserted_email=caller.asserted_email)


def _mask(paths: Sequence[str]) -> list[str]:
    return [p for p in paths if p]


def _page(queryset: QuerySet[Any, Any], request: Any, *, fields: Mapping[str, FilterField], orderable: Mapping[str, str],
          fingerprint: str, default_order: Sequence[str]) -> listing.Page[Any]:
    """One page for a List/Search request (any message with filter, page_size, page_token)."""
    try:
        return listing.list_page(
            queryset, fields=fields, orderable=orderable, filter=request.filter,
            order_by=getattr(request, "order_by", ""),  # google.longrunning lists have none
            page_size=request.page_size, page_token=request.page_token, fingerprint=fingerprint,
            default_order=default_order,
        )
    except listing.ListingError as exc:
        field = {"FilterError": "filter", "OrderByError": "order_by", "PageTokenError": "page_token",
                 "PageSizeError": "page_size"}.get(type(exc).__name__)
        raise InvalidArgument(str(exc), field=field) from None


def _enum(lookup: str, enum: Any) -> FilterField:
    return FilterField.for_proto_enum(lookup, enum.DESCRIPTOR)


# --- Experiments ----------------------------------------------------------------------------

EXPERIMENT_FIELDS = {
    "name": FilterField("api_name", "string"),
    "title": FilterField("title", "string"),
    "creator": FilterField("creator", "string"),
    "tags": FilterField("tags", "string_list"),
    "notes": FilterField("notes", "string"),
    "create_time": FilterField("create_time", "timestamp"),
    "update_time": FilterField("update_time", "timestamp"),
    "priority": _enum("priority", pb.priority.Priority),
    "status.active_state": _enum("active_state", pb.status.ExperimentStatus.ActiveState),
    "status.launch_state": _enum("launch_state", pb.status.ExperimentStatus.LaunchState),
}
EXPERIMENT_ORDER = {"create_time": "create_time", "update_time": "update_time", "title": "title",
                    "creator": "creator", "name": "id"}


@rpc(ESS, "CreateExperiment", api.CreateExperimentRequest, pb.experiment.Experiment)
def create_experiment(request: api.CreateExperimentRequest, caller: Caller) -> pb.experiment.Experiment:
    return experiment_to_proto(experiment_services.create_experiment(request.experiment, creator=caller.email))


@rpc(ESS, "UpdateExperimentLaunchState", api.UpdateExperimentLaunchStateRequest, pb.experiment.Experiment)
def update_launch_state(request: api.UpdateExperimentLaunchStateRequest, caller: Caller) -> pb.experiment.Experiment:
    xid = parse_experiment(request.name)
    _experiment(xid, caller, Role.WRITER)
    return experiment_to_proto(experiment_services.update_launch_state(xid, request.launch_state))


@rpc(ESS, "GetExperiment", api.GetExperimentRequest, pb.experiment.Experiment)
def get_experiment(request: api.GetExperimentRequest, caller: Caller) -> pb.experiment.Experiment:
    return reads.get_experiment(parse_experiment(request.name), caller.identity)


@rpc(ESS, "GetExperimentStatus", api.GetExperimentStatusRequest, pb.status.ExperimentStatus)
def get_experiment_status(request: api.GetExperimentStatusRequest, caller: Caller) -> pb.status.ExperimentStatus:
    return reads.get_experiment_status(parse_experiment(request.name), caller.identity)


def _list_experiments(request: api.ListExperimentsRequest, caller: Caller) -> api.ListExperimentsResponse:
    queryset = Experiment.objects.filter(acl.readable_q(caller.identity)).annotate(
        api_name=Concat(Value("experiments/"), Cast("id", CharField()))
    )
    page = _page(queryset, request, fields=EXPERIMENT_FIELDS, orderable=EXPERIMENT_ORDER,
                 fingerprint=f"experiments|{caller.email}", default_order=["create_time desc"])
    return api.ListExperimentsResponse(
        experiments=[experiment_to_proto(e) for e in page.items], next_page_token=page.next_page_token
    )


rpc(ESS, "ListExperiments", api.ListExperimentsRequest, api.ListExperimentsResponse)(_list_experiments)
rpc(ESS, "SearchExperiments", api.ListExperimentsRequest, api.ListExperimentsResponse)(_list_experiments)


@rpc(ESS, "UpdateExperiment", api.UpdateExperimentRequest, pb.experiment.Experiment)
def update_experiment(request: api.UpdateExperimentRequest, caller: Caller) -> pb.experiment.Experiment:
    xid = parse_experiment(request.experiment.name, "experiment.name")
    paths = _mask(request.update_mask.paths)
    _experiment(xid, caller, Role.OWNER if "acls" in paths else Role.WRITER)
    return experiment_to_proto(experiment_services.update_experiment(xid, request.experiment, paths))


# --- Work units -------------------------------------------------------------------------------

WORK_UNIT_FIELDS = {
    "name": FilterField("api_name", "string"),
    "wid": FilterField("wid", "int"),
    "state": _enum("current_state", pb.status.WorkUnitStatus.WorkUnitState),
    "work_unit_type": _enum("work_unit_type", pb.work_unit.WorkUnit.WorkUnitType),
    "priority": _enum("priority", pb.priority.Priority),
    "tags": FilterField("tags", "string_list"),
    "notes": FilterField("notes", "string"),
    "create_time": FilterField("create_time", "timestamp"),
    "update_time": FilterField("update_time", "timestamp"),
}
WORK_UNIT_ORDER = {"wid": "wid", "name": "wid", "create_time": "create_time", "update_time": "update_time",
                   "state": "current_state"}


def work_units_of(xid: int) -> QuerySet[WorkUnit]:
    """Work units of an experiment, with the filterable name (the current state is the work unit's own
    column, `WorkUnit.current_state`)."""
    return WorkUnit.objects.filter(experiment_id=xid).annotate(
        api_name=Concat(Value(f"experiments/{xid}/workUnits/"), Cast("wid", CharField())))


def _work_unit_proto(wu: WorkUnit) -> pb.work_unit.WorkUnit:
    return work_unit_to_proto(wu, cast(Any, reads.active_executions([wu.id]).get(wu.id)))


def _operation(op: Operation) -> lro.Operation:
    return operation_to_proto(op)


@rpc(ESS, "CreateWorkUnit", api.CreateWorkUnitRequest, lro.Operation)
def create_work_unit(request: api.CreateWorkUnitRequest, caller: Caller) -> lro.Operation:
    xid = parse_experiment(request.parent, "parent")
    _experiment(xid, caller, Role.WRITER)
    op = wu_services.create_work_unit(xid, request.work_unit, work_unit_id=request.work_unit_id,
                                      requester=_requester(caller))
    return _operation(op)


@rpc(ESS, "GetWorkUnit", api.GetWorkUnitRequest, pb.work_unit.WorkUnit)
def get_work_unit(request: api.GetWorkUnitRequest, caller: Caller) -> pb.work_unit.WorkUnit:
    return reads.work_unit(*parse_work_unit(request.name), caller.identity)


@rpc(ESS, "GetCurrentWorkUnitExecution", api.GetCurrentWorkUnitExecutionRequest,
     pb.work_unit_execution.WorkUnitExecution)
def get_current_execution(request: api.GetCurrentWorkUnitExecutionRequest,
                          caller: Caller) -> pb.work_unit_execution.WorkUnitExecution:
    return reads.current_execution(*parse_work_unit(request.name), caller.identity)


@rpc(ESS, "ListWorkUnitExecutions", api.ListWorkUnitExecutionsRequest, api.ListWorkUnitExecutionsResponse)
def list_executions(request: api.ListWorkUnitExecutionsRequest, caller: Caller) -> api.ListWorkUnitExecutionsResponse:
    return api.ListWorkUnitExecutionsResponse(
        work_unit_executions=reads.executions(*parse_work_unit(request.parent, "parent"), caller.identity)
    )


#: The ACTIVE execution of the outer work unit as one JSON object (keys: `reads.ExecutionRow.COLUMNS`).
_CURRENT_EXECUTION_JSON = Subquery(
    WorkUnitExecution.objects.filter(work_unit=OuterRef("pk"), execution_state=ExecutionState.ACTIVE)
    .values(row=JSONObject(**{column: column for column in reads.ExecutionRow.COLUMNS}))[:1]
)


def _page_under_experiment(xid: int, caller: Caller, queryset: QuerySet[Any, Any], request: Any,
                           **options: Any) -> listing.Page[Any]:
    """A page of children of experiment ``xid`` with the caller's access checked, in one statement.

    Each row carries its experiment's ACLs (``experiment_acls``), so a
    non-empty page needs no separate access read. Permission first
    (AIP-211) still holds: nothing is returned before the check, an empty
    page falls back to the ACL read, and a request the listing refuses
    (filter, order, token) is judged only after the caller was found to be
    allowed to read the experiment.
    """
    try:
        page = _page(queryset.annotate(experiment_acls=F("experiment__acls")), request, **options)
    except InvalidArgument:
        _experiment(xid, caller, Role.READER)
        raise
    if page.items:
        reads.require_acls(xid, page.items[0].experiment_acls, caller.identity, Role.READER)
    else:
        _experiment(xid, caller, Role.READER)
    return page


def sweep_columns(xid: int) -> SweepColumns:
    """The work unit fields of experiment ``xid`` with its ``args.<name>`` and ``metrics.<name>.<stat>``
    (the argument statistics are read only when an ``args.`` name is: a plain list stays one statement)."""
    return SweepColumns(xid, WORK_UNIT_FIELDS, WORK_UNIT_ORDER)


def _list_work_units(request: api.ListWorkUnitsRequest, caller: Caller) -> api.ListWorkUnitsResponse:
    xid = parse_experiment(request.parent, "parent")
    columns = sweep_columns(xid)
    prepare_columns(columns, request.filter, request.order_by)
    queryset = columns.apply(work_units_of(xid).annotate(current_execution=_CURRENT_EXECUTION_JSON))
    page = _page_under_experiment(xid, caller, queryset, request, fields=columns.fields, orderable=columns.orderable,
                                  fingerprint=f"workUnits|{request.parent}", default_order=["wid"])
    return api.ListWorkUnitsResponse(
        work_units=[work_unit_to_proto(wu, cast(Any, reads.execution_row(wu.current_execution)))
                    for wu in page.items],
        next_page_token=page.next_page_token,
    )


rpc(ESS, "ListWorkUnits", api.ListWorkUnitsRequest, api.ListWorkUnitsResponse)(_list_work_units)
rpc(ESS, "SearchWorkUnits", api.ListWorkUnitsRequest, api.ListWorkUnitsResponse)(_list_work_units)


def _targets(xid: int, filter_text: str) -> list[int] | None:
    """Work unit ids a batch RPC's filter selects (None: every work unit)."""
    if not filter_text.strip():
        return None
    try:
        condition = listing.compile_filter(filter_text, WORK_UNIT_FIELDS)
    except listing.ListingError as exc:
        raise InvalidArgument(str(exc), field="filter") from None
    return list(work_units_of(xid).filter(condition).values_list("wid", flat=True))


def _batch(request: Any, caller: Caller, action: Callable[..., Operation]) -> lro.Operation:
    xid = parse_experiment(request.parent, "parent")
    _experiment(xid, caller, Role.WRITER)
    wids = _targets(xid, request.filter)
    return _operation(action(xid, wids, batch=True, requester=_requester(caller)))


@rpc(ESS, "StopWorkUnit", api.StopWorkUnitRequest, lro.Operation)
def stop_work_unit(request: api.StopWorkUnitRequest, caller: Caller) -> lro.Operation:
    xid, wid = parse_work_unit(request.name)
    _work_unit(xid, wid, caller, Role.WRITER)
    return _operation(wu_services.stop_work_units(xid, [wid], batch=False, requester=_requester(caller)))


@rpc(ESS, "BatchStopWorkUnits", api.BatchStopWorkUnitsRequest, lro.Operation)
def batch_stop(request: api.BatchStopWorkUnitsRequest, caller: Caller) -> lro.Operation:
    return _batch(request, caller, wu_services.stop_work_units)


@rpc(ESS, "RestartWorkUnit", api.RestartWorkUnitRequest, lro.Operation)
def restart_work_unit(request: api.RestartWorkUnitRequest, caller: Caller) -> lro.Operation:
    xid, wid = parse_work_unit(request.name)
    _work_unit(xid, wid, caller, Role.WRITER)
    return _operation(wu_services.restart_work_units(xid, [wid], batch=False, requester=_requester(caller)))


@rpc(ESS, "BatchRestartWorkUnits", api.BatchRestartWorkUnitsRequest, lro.Operation)
def batch_restart(request: api.BatchRestartWorkUnitsRequest, caller: Caller) -> lro.Operation:
    return _batch(request, caller, wu_services.restart_work_units)


@rpc(ESS, "UpdateWorkUnit", api.UpdateWorkUnitRequest, pb.work_unit.WorkUnit)
def update_work_unit(request: api.UpdateWorkUnitRequest, caller: Caller) -> pb.work_unit.WorkUnit:
    xid, wid = parse_work_unit(request.work_unit.name, "work_unit.name")
    _work_unit(xid, wid, caller, Role.WRITER)
    wu = wu_services.update_work_unit(xid, wid, request.work_unit, _mask(request.update_mask.paths))
    return _work_unit_proto(wu)


# --- Artifacts -----------------------------------------------------------------------------------

ARTIFACT_FIELDS = {
    "lifecycle_phase": _enum("lifecycle_phase", pb.artifact.Artifact.LifecyclePhase),
    "data_type": _enum("data_type", pb.artifact.Artifact.DataType),
    "tags": FilterField("tags", "string_list"),
    "mime_type": FilterField("mime_type", "string"),
    "notes": FilterField("notes", "string"),
    "create_time": FilterField("create_time", "timestamp"),
}
ARTIFACT_ORDER = {"create_time": "create_time", "update_time": "update_time", "name": "id"}


def _artifact(aid: int, caller: Caller, needed: Role, field: str = "name") -> Artifact:
    artifact = Artifact.objects.select_related("work_unit", "experiment").filter(id=aid).first()
    # A missing artifact names no experiment: None (denied, NOT_FOUND for staff).
    access.require(caller.identity, artifact.experiment.acls if artifact else None, needed,
                   resource=f"artifacts/{aid}", field=field)
    assert artifact is not None
    return artifact


@rpc(ESS, "CreateArtifact", api.CreateArtifactRequest, pb.artifact.Artifact)
def create_artifact(request: api.CreateArtifactRequest, caller: Caller) -> pb.artifact.Artifact:
    xid, wid = parse_parent(request.parent)
    _experiment(xid, caller, Role.WRITER)
    return artifact_to_proto(artifact_services.create_artifact(xid, wid, request.artifact))


@rpc(ESS, "GetArtifact", api.GetArtifactRequest, pb.artifact.Artifact)
def get_artifact(request: api.GetArtifactRequest, caller: Caller) -> pb.artifact.Artifact:
    return artifact_to_proto(_artifact(parse_artifact(request.name), caller, Role.READER))


def _list_artifacts(request: api.ListArtifactsRequest, caller: Caller) -> api.ListArtifactsResponse:
    queryset = Artifact.objects.select_related("work_unit", "experiment")
    if request.parent:
        xid, wid = parse_parent(request.parent)
        _experiment(xid, caller, Role.READER)
        # A collection holds what is attached to its parent: an experiment's
        # artifacts are its own, not its work units' (AIP-132).
        queryset = queryset.filter(experiment_id=xid)
        queryset = queryset.filter(work_unit__wid=wid) if wid is not None else queryset.filter(work_unit__isnull=True)
    else:
        queryset = queryset.filter(acl.readable_q(caller.identity, prefix="experiment__"))
    page = _page(queryset, request, fields=ARTIFACT_FIELDS, orderable=ARTIFACT_ORDER,
                 fingerprint=f"artifacts|{request.parent}|{caller.email}", default_order=["name"])
    return api.ListArtifactsResponse(
        artifacts=[artifact_to_proto(a) for a in page.items], next_page_token=page.next_page_token
    )


rpc(ESS, "ListArtifacts", api.ListArtifactsRequest, api.ListArtifactsResponse)(_list_artifacts)
rpc(ESS, "SearchArtifacts", api.ListArtifactsRequest, api.ListArtifactsResponse)(_list_artifacts)


@rpc(ESS, "DeleteArtifact", api.DeleteArtifactRequest, empty_pb2.Empty)
def delete_artifact(request: api.DeleteArtifactRequest, caller: Caller) -> empty_pb2.Empty:
    aid = parse_artifact(request.name)
    _artifact(aid, caller, Role.WRITER)
    artifact_services.delete_artifact(aid)
    return empty_pb2.Empty()


@rpc(ESS, "UpdateArtifact", api.UpdateArtifactRequest, pb.artifact.Artifact)
def update_artifact(request: api.UpdateArtifactRequest, caller: Caller) -> pb.artifact.Artifact:
    aid = parse_artifact(request.artifact.name, "artifact.name")
    _artifact(aid, caller, Role.WRITER)
    return artifact_to_proto(
        artifact_services.update_artifact(aid, request.artifact, _mask(request.update_mask.paths))
    )


# --- Status messages ---------------------------------------------------------------------------------

STATUS_MESSAGE_FIELDS = {
    "severity": _enum("severity", pb.structured_message.StructuredMessage.Severity),
    "source": _enum("source", pb.structured_message.StructuredMessage.Source),
    "execution_id": FilterField("execution_id", "int"),
    "create_time": FilterField("create_time", "timestamp"),
}
STATUS_MESSAGE_ORDER = {"create_time": "create_time", "name": "id", "execution_id": "execution_id"}


def _list_status_messages(request: api.ListStatusMessagesRequest, caller: Caller) -> api.ListStatusMessagesResponse:
    xid, wid = parse_parent(request.parent)
    _experiment(xid, caller, Role.READER)
    # Unlike artifacts, an experiment's status messages include its work
    # units' (each names its own parent): the experiment-level list is what a
    # user reads to see what went wrong anywhere in the experiment.
    queryset = StatusMessage.objects.filter(experiment_id=xid).select_related("work_unit")
    if wid is not None:
        queryset = queryset.filter(work_unit__wid=wid)
    page = _page(queryset, request, fields=STATUS_MESSAGE_FIELDS, orderable=STATUS_MESSAGE_ORDER,
                 fingerprint=f"statusMessages|{request.parent}", default_order=["name desc"])
    return api.ListStatusMessagesResponse(
        status_messages=[status_message_to_proto(m) for m in page.items],
        next_page_token=page.next_page_token,
    )


rpc(ESS, "ListStatusMessages", api.ListStatusMessagesRequest, api.ListStatusMessagesResponse)(_list_status_messages)
rpc(ESS, "SearchStatusMessages", api.ListStatusMessagesRequest, api.ListStatusMessagesResponse)(_list_status_messages)


# --- google.longrunning.Operations ---------------------------------------------------------------------


def _operation_row(name: str, caller: Caller, needed: Role) -> Operation:
    xid, wid, op_id = names.parse_operation(name)
    op = (Operation.objects.select_related("work_unit", "experiment")
          .filter(id=op_id, experiment_id=xid, action_type__in=API_ACTION_TYPES).first())
    if op is None or (wid is not None and (op.work_unit is None or op.work_unit.wid != wid)):
        raise access.missing_child(caller.identity, op.experiment.acls if op else _experiment_acls(xid), needed,
                                   resource=name)
    access.require(caller.identity, op.experiment.acls, needed, resource=name)
    return op


@rpc(OPERATIONS, "GetOperation", lro.GetOperationRequest, lro.Operation)
def get_operation(request: lro.GetOperationRequest, caller: Caller) -> lro.Operation:
    return _operation(_operation_row(request.name, caller, Role.READER))


OPERATION_FIELDS = {
    "done": FilterField("done", "bool"),
    "action_type": _enum("action_type", pb.operations.OperationMetadata.ActionType),
    "create_time": FilterField("create_time", "timestamp"),
}


@rpc(OPERATIONS, "ListOperations", lro.ListOperationsRequest, lro.ListOperationsResponse)
def list_operations(request: lro.ListOperationsRequest, caller: Caller) -> lro.ListOperationsResponse:
    """Operations under ``experiments/{xid}`` or one of its work units (``name`` is the collection)."""
    collection = request.name.removesuffix("/operations")
    xid, wid = parse_parent(collection, "name")
    queryset = (Operation.objects.filter(experiment_id=xid, parent__isnull=True, action_type__in=API_ACTION_TYPES)
                .select_related("work_unit"))
    if wid is not None:
        queryset = queryset.filter(work_unit__wid=wid)

    page = _page_under_experiment(xid, caller, queryset, request, fields=OPERATION_FIELDS,
                                  orderable={"create_time": "create_time"},
                                  fingerprint=f"operations|{collection}", default_order=["create_time desc"])
    return lro.ListOperationsResponse(operations=[_operation(op) for op in page.items],
                                      next_page_token=page.next_page_token)


#: WaitOperation never holds a server thread longer than this (``XMC_WAIT_MAX_S`` may lower it).
MAX_WAIT_S = 30.0


@rpc(OPERATIONS, "WaitOperation", lro.WaitOperationRequest, lro.Operation)
def wait_operation(request: lro.WaitOperationRequest, caller: Caller) -> lro.Operation:
    op = _operation_row(request.name, caller, Role.READER)
    cap = min(MAX_WAIT_S, float(settings.XMC_WAIT_MAX_S))
    # Seconds and nanos read directly: ``ToTimedelta`` overflows on huge values.
    timeout = (request.timeout.seconds + request.timeout.nanos / 1e9) if request.HasField("timeout") else cap
    deadline = time.monotonic() + max(0.0, min(timeout, cap))
    # No free slot (xmc.api.waits): answer now with the operation as it is.
    with waits.slot(caller.email) as granted:
        while granted and not op.done and time.monotonic() < deadline:
            time.sleep(0.2)
            op.refresh_from_db(fields=["done", "end_time", "error", "response"])
    return _operation(op)


@rpc(OPERATIONS, "CancelOperation", lro.CancelOperationRequest, empty_pb2.Empty)
def cancel_operation(request: lro.CancelOperationRequest, caller: Caller) -> empty_pb2.Empty:
    op = _operation_row(request.name, caller, Role.WRITER)
    wu_services.request_operation_cancellation(op.id, requester=_requester(caller))
    return empty_pb2.Empty()


@rpc(OPERATIONS, "DeleteOperation", lro.DeleteOperationRequest, empty_pb2.Empty)
def delete_operation(request: lro.DeleteOperationRequest, caller: Caller) -> empty_pb2.Empty:
    op = _operation_row(request.name, caller, Role.WRITER)
    wu_services.delete_operation(op.id)
    return empty_pb2.Empty()
