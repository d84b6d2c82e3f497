"""The gRPC server on a real port: who gets in, what every method answers, how errors look.

Everything goes through a real channel and the stubs generated in the
``xmanager`` wheel, against `xmc.api.grpc_server.build_server` with the real
interceptors and handlers (session fixture ``grpc_server``). Where a test
needs a handler to misbehave on purpose, it swaps one entry of
`xmc.api.registry.RPCS` for the duration of the test.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.longrunning import operations_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from core import errors, pb
from tests.api.grpc_server.conftest import metadata_for
from xmc.api import registry
from xmc.api.grpc_server import ESS, INTERNAL_MESSAGE, OPERATIONS, STATUS_DETAILS_KEY, service_methods
from xmc.listing.errors import FilterError

api = pb.api


@pytest.fixture
def swap_handler(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str, Callable[..., Any]], None]:
    """Replace the registered handler of one method for this test only."""

    def swap(service: str, method: str, handler: Callable[..., Any]) -> None:
        rpc = registry.RPCS[(service, method)]
        monkeypatch.setitem(
            registry.RPCS, (service, method), registry.Rpc(service, method, rpc.request, rpc.response, handler)
        )

    return swap


# --- Who gets in ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["CreateExperiment", "SearchExperiments", "CreateWorkUnit"])
def test_it_refuses_an_api_call_without_a_token(ess: Any, method: str) -> None:
    # Contract 1.4, row 3: XMC_USER_EMAIL set, no token -> no authorization header at all.
    request = registry.RPCS[(ESS, method)].request()
    with pytest.raises(grpc.RpcError) as refused:
        getattr(ess, method)(request, metadata=[("x-goog-user-email", "carol@example.com")], timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "missing bearer token" in refused.value.details()


def test_it_refuses_the_operations_service_without_a_token(operations: Any) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        operations.GetOperation(operations_pb2.GetOperationRequest(name="experiments/1/operations/1"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_it_refuses_an_opaque_token_even_with_an_asserted_email(ess: Any) -> None:
    # Contract 1.4, row 2: opaque token + XMC_USER_EMAIL. Only our own JWTs prove anything.
    with pytest.raises(grpc.RpcError) as refused:
        ess.SearchExperiments(
            api.ListExperimentsRequest(),
            metadata=[("authorization", "Bearer opaque-tok-123"), ("x-goog-user-email", "bob@example.com")],
            timeout=10,
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.django_db(transaction=True)
def test_it_hands_the_verified_caller_and_the_asserted_email_to_the_handler(
    ess: Any, swap_handler: Any, fresh_email: Callable[[str], str]
) -> None:
    seen: list[registry.Caller] = []

    def spy(request: Any, caller: registry.Caller) -> Any:
        seen.append(caller)
        return pb.experiment.Experiment(name="experiments/7", creator=caller.email)

    swap_handler(ESS, "GetExperiment", spy)
    alice = fresh_email("alice")
    reply = ess.GetExperiment(
        api.GetExperimentRequest(name="experiments/7"), metadata=metadata_for(alice, "oscar@example.com"), timeout=10
    )

    assert reply.creator == alice
    [caller] = seen
    assert caller.identity.email == alice
    assert caller.asserted_email == "oscar@example.com"  # audit only


# --- Every method is served ----------------------------------------------------------------


def test_it_registers_a_handler_for_every_method_of_both_services() -> None:
    import xmc.api.handlers  # noqa: F401

    assert len(service_methods(ESS)) == 26
    missing = [
        (service, method)
        for service in (ESS, OPERATIONS)
        for method in service_methods(service)
        if (service, method) not in registry.RPCS
    ]
    assert missing == []


def _all_methods() -> list[tuple[str, str]]:
    return [(ESS, m) for m in service_methods(ESS)] + [(OPERATIONS, m) for m in service_methods(OPERATIONS)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("service", "method"), _all_methods(), ids=lambda v: v.rsplit(".", 1)[-1])
def test_it_answers_every_method_with_a_typed_reply_or_a_clean_error(
    channel: grpc.Channel, as_alice: list[tuple[str, str]], service: str, method: str
) -> None:
    # Contract 7: a minimal request to each method gives a response or a clean
    # client error -- never UNIMPLEMENTED, never INTERNAL or UNKNOWN.
    rpc = registry.RPCS[(service, method)]
    call = channel.unary_unary(
        rpc.full_name, request_serializer=rpc.request.SerializeToString, response_deserializer=rpc.response.FromString
    )
    try:
        reply = call(rpc.request(), metadata=as_alice, timeout=20)
    except grpc.RpcError as exc:
        assert exc.code() in {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}, (exc.code(), exc.details())
    else:
        assert isinstance(reply, rpc.response)


# --- Errors ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_answers_permission_denied_for_an_experiment_nobody_created(ess: Any, as_alice: list[tuple[str, str]]) -> None:
    # AIP-211: a caller who could not read it learns nothing about its existence.
    with pytest.raises(grpc.RpcError) as missing:
        ess.GetExperiment(api.GetExperimentRequest(name="experiments/987654321"), metadata=as_alice, timeout=10)
    assert missing.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "987654321" in missing.value.details()


@pytest.mark.django_db(transaction=True)
def test_it_answers_invalid_argument_for_a_bad_name_and_a_bad_filter(
    ess: Any, as_alice: list[tuple[str, str]]
) -> None:
    with pytest.raises(grpc.RpcError) as bad_name:
        ess.GetExperiment(api.GetExperimentRequest(name="operations/abc"), metadata=as_alice, timeout=10)
    assert bad_name.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as bad_filter:
        ess.SearchExperiments(api.ListExperimentsRequest(filter="colour = 'red'"), metadata=as_alice, timeout=10)
    assert bad_filter.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [_field_at_fault(bad_name.value), _field_at_fault(bad_filter.value)] == ["name", "filter"]


def _field_at_fault(error: Any) -> str:
    [details] = [v for k, v in error.trailing_metadata() if k == STATUS_DETAILS_KEY]
    bad_request = error_details_pb2.BadRequest()
    assert pb.rpc_status.Status.FromString(details).details[0].Unpack(bad_request)
    [violation] = bad_request.field_violations
    return str(violation.field)


ERRORS = [
    errors.InvalidArgument,
    errors.NotFound,
    errors.AlreadyExists,
    errors.FailedPrecondition,
    errors.PermissionDenied,
    errors.Unauthenticated,
    errors.ResourceExhausted,
    errors.Aborted,
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.code)
def test_it_turns_each_service_error_into_its_status_code(
    ess: Any, as_alice: list[tuple[str, str]], swap_handler: Any, error: type[errors.ServiceError]
) -> None:
    def fail(request: Any, caller: registry.Caller) -> Any:
        raise error(f"{error.code.lower()} because the story says so", field="name")

    swap_handler(ESS, "GetWorkUnit", fail)
    with pytest.raises(grpc.RpcError) as failed:
        ess.GetWorkUnit(api.GetWorkUnitRequest(name="experiments/1/workUnits/1"), metadata=as_alice, timeout=10)
    assert failed.value.code() == grpc.StatusCode[error.code]
    assert failed.value.details() == f"{error.code.lower()} because the story says so"
    # The field at fault travels as a google.rpc.Status with a BadRequest, like REST's error details.
    [details] = [v for k, v in failed.value.trailing_metadata() if k == STATUS_DETAILS_KEY]
    status = pb.rpc_status.Status.FromString(details)
    assert (status.code, status.message) == (grpc.StatusCode[error.code].value[0], failed.value.details())
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert [(v.field, v.description) for v in bad_request.field_violations] == [("name", failed.value.details())]


@pytest.mark.django_db(transaction=True)
def test_it_turns_a_listing_error_that_slipped_through_into_invalid_argument(
    ess: Any, as_alice: list[tuple[str, str]], swap_handler: Any
) -> None:
    def fail(request: Any, caller: registry.Caller) -> Any:
        raise FilterError("unknown field 'colour' at position 0")

    swap_handler(ESS, "SearchWorkUnits", fail)
    with pytest.raises(grpc.RpcError) as failed:
        ess.SearchWorkUnits(api.ListWorkUnitsRequest(parent="experiments/1"), metadata=as_alice, timeout=10)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failed.value.details() == "unknown field 'colour' at position 0"


@pytest.mark.django_db(transaction=True)
def test_it_answers_internal_without_the_traceback_and_logs_it(
    ess: Any, as_alice: list[tuple[str, str]], swap_handler: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def crash(request: Any, caller: registry.Caller) -> Any:
        raise KeyError("secret-internal-detail")

    swap_handler(ESS, "GetExperiment", crash)
    with caplog.at_level(logging.ERROR, logger="xmc.api.grpc_server"):
        with pytest.raises(grpc.RpcError) as failed:
            ess.GetExperiment(api.GetExperimentRequest(name="experiments/1"), metadata=as_alice, timeout=10)

    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert failed.value.details() == INTERNAL_MESSAGE
    assert "secret-internal-detail" not in failed.value.details()
    [record] = [r for r in caplog.records if r.getMessage().startswith("grpc.internal_error")]
    assert "ExperimentStateService/GetExperiment" in record.method
    assert record.exc_info is not None and "secret-internal-detail" in str(record.exc_info[1])


@pytest.mark.django_db(transaction=True)
def test_it_keeps_serving_after_a_handler_crashed(
    ess: Any, as_alice: list[tuple[str, str]], swap_handler: Any
) -> None:
    def crash(request: Any, caller: registry.Caller) -> Any:
        raise RuntimeError("boom")

    swap_handler(ESS, "GetExperimentStatus", crash)
    for _ in range(3):
        with pytest.raises(grpc.RpcError):
            ess.GetExperimentStatus(api.GetExperimentStatusRequest(name="experiments/1"), metadata=as_alice, timeout=10)
    created = ess.CreateExperiment(api.CreateExperimentRequest(), metadata=as_alice, timeout=10)
    assert created.name.startswith("experiments/")


# --- Health and reflection ------------------------------------------------------------------


@pytest.mark.parametrize("service", ["", ESS, OPERATIONS])
def test_it_reports_serving_to_health_checks_without_a_token(channel: grpc.Channel, service: str) -> None:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_it_answers_not_found_for_the_health_of_an_unknown_service(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as unknown:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope.Service"), timeout=10)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def _reflect(channel: grpc.Channel, *requests: reflection_pb2.ServerReflectionRequest) -> list[Any]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    return list(stub.ServerReflectionInfo(iter(requests), timeout=10))


def test_it_lists_both_api_services_through_reflection(channel: grpc.Channel) -> None:
    [reply] = _reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in reply.list_services_response.service}
    assert {ESS, OPERATIONS, "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize("symbol", [ESS, OPERATIONS, "cloud.xmanager.v1.WorkUnit"])
def test_it_serves_the_descriptors_of_the_services_through_reflection(channel: grpc.Channel, symbol: str) -> None:
    # What grpcurl does before it can call anything.
    [reply] = _reflect(channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol))
    assert reply.WhichOneof("message_response") == "file_descriptor_response"
    assert reply.file_descriptor_response.file_descriptor_proto


@pytest.mark.django_db  # issue_token reads the token generation
def test_it_answers_unimplemented_for_a_service_it_does_not_have(channel: grpc.Channel) -> None:
    call = channel.unary_unary("/cloud.xmanager.v1.XidService/GetXidEntry")
    with pytest.raises(grpc.RpcError) as missing:
        call(b"", metadata=metadata_for("alice@example.com"), timeout=10)
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED



# --- Operations, as a future client would use them ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_serves_the_work_unit_operation_the_client_was_given_through_operations(
    ess: Any, operations: Any, as_alice: list[tuple[str, str]]
) -> None:
    experiment = ess.CreateExperiment(api.CreateExperimentRequest(), metadata=as_alice, timeout=10)
    job = pb.work_unit.KubernetesJob(
        name="t",
        spec=pb.work_unit.ExecutableSpec(
            docker_image="gcr.io/proj/t:v1",
            resources=pb.resources.ResourceSet(
                cpu_resources=pb.resources.CpuResources(cpu_millicores=1000, memory_bytes=2**30)
            ),
        ),
        replicas=1,
    )
    created = ess.CreateWorkUnit(
        api.CreateWorkUnitRequest(
            parent=experiment.name,
            work_unit_id=1,
            work_unit=pb.work_unit.WorkUnit(
                executable=pb.work_unit.Executable(jobset=pb.work_unit.JobSetExecutable(jobs=[job]))
            ),
        ),
        metadata=as_alice,
        timeout=10,
    )
    assert created.name.startswith(f"{experiment.name}/workUnits/1/operations/")

    fetched = operations.GetOperation(operations_pb2.GetOperationRequest(name=created.name), metadata=as_alice, timeout=10)
    waited = operations.WaitOperation(
        operations_pb2.WaitOperationRequest(name=created.name, timeout={"nanos": 1}), metadata=as_alice, timeout=10
    )
    listed = operations.ListOperations(
        operations_pb2.ListOperationsRequest(name=f"{experiment.name}/operations"), metadata=as_alice, timeout=10
    )

    assert fetched.name == waited.name == created.name
    metadata = pb.operations.OperationMetadata()
    assert fetched.metadata.Unpack(metadata)
    assert metadata.target == f"{experiment.name}/workUnits/1"
    assert metadata.action_type == pb.operations.OperationMetadata.ActionType.CREATE
    assert metadata.original_requester == dict(as_alice)["x-goog-user-email"]
    assert created.name in [op.name for op in listed.operations]


@pytest.mark.django_db(transaction=True)
def test_it_logs_each_call_with_its_code_and_duration(
    ess: Any, as_alice: list[tuple[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="xmc.api.grpc_server"):
        with pytest.raises(grpc.RpcError):
            ess.GetExperiment(api.GetExperimentRequest(name="experiments/424242"), metadata=as_alice, timeout=10)
    [record] = [r for r in caplog.records if r.getMessage() == "grpc.rpc"]
    # One structured line (JSON with XMC_LOG_FORMAT=json): method, canonical code, duration.
    assert record.method == "/cloud.xmanager.v1.ExperimentStateService/GetExperiment"  # type: ignore[attr-defined]
    assert record.code == "PERMISSION_DENIED"  # type: ignore[attr-defined]
    assert record.duration_ms >= 0  # type: ignore[attr-defined]