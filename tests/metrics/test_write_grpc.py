"""``xmc.metrics.v1.MetricsService/WriteMetrics``: the write path over gRPC, on the real server."""
from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from core.protos import metrics_pb2
from metrics import tokens
from metrics.models import MetricPoint
from tests import factories
from tests.metrics.conftest import (
    experiment_for,
    fresh_write_buckets,
    metadata_for,
    stored_summaries,
    summaries_from_points,
)

pytestmark = pytest.mark.django_db(transaction=True)

P = metrics_pb2


@pytest.fixture
def write(channel: grpc.Channel) -> Any:
    return channel.unary_unary("/xmc.metrics.v1.MetricsService/WriteMetrics",
                               request_serializer=P.WriteMetricsRequest.SerializeToString,
                               response_deserializer=P.WriteMetricsResponse.FromString)


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_it_writes_points_with_the_token_idempotently_and_refuses_the_rest(write: Any, channel: grpc.Channel) -> None:
    exp = experiment_for("alice@example.com")
    factories.work_unit(exp, wid=1)
    parent = f"experiments/{exp.id}/workUnits/1"
    request = P.WriteMetricsRequest(parent=parent, points=[P.MetricPoint(metric="loss", step=s, value=s / 10)
                                                           for s in range(3)])
    token = _bearer(tokens.token_for(exp.id, 1, 1))
    assert write(request, metadata=token) == P.WriteMetricsResponse(written=3, duplicates=0)
    assert write(request, metadata=token) == P.WriteMetricsResponse(written=0, duplicates=3)
    assert MetricPoint.objects.count() == 3
    for metadata, code in ((_bearer(tokens.token_for(exp.id, 2, 1)), grpc.StatusCode.PERMISSION_DENIED),
                           ([], grpc.StatusCode.UNAUTHENTICATED),
                           (metadata_for("eve@example.com"), grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.RpcError) as info:
            write(request, metadata=metadata)
        assert info.value.code() == code
    bad = P.WriteMetricsRequest(parent=parent, points=[P.MetricPoint(metric="x", step=1, value=float("inf"))])
    with pytest.raises(grpc.RpcError) as info:
        write(bad, metadata=token)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "points[0].value" in info.value.details()
    # The owner's own token writes into the current execution.
    assert write(P.WriteMetricsRequest(parent=parent, points=[P.MetricPoint(metric="m", value=1)]),
                 metadata=metadata_for("alice@example.com")).written == 1
    # The summaries came with the points (docs/architecture/sweeps.md).
    assert stored_summaries() == summaries_from_points() and len(stored_summaries()) == 2
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="xmc.metrics.v1.MetricsService"))
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_it_answers_resource_exhausted_to_an_execution_writing_too_often(write: Any, settings: Any) -> None:
    settings.XMC_METRICS_WRITES_PER_S, settings.XMC_METRICS_WRITES_BURST = 0.001, 1
    exp = experiment_for("alice@example.com")
    fresh_write_buckets(factories.work_unit(exp, wid=1))
    token = _bearer(tokens.token_for(exp.id, 1, 1))
    parent = f"experiments/{exp.id}/workUnits/1"
    assert write(P.WriteMetricsRequest(parent=parent, points=[P.MetricPoint(metric="m", step=0, value=1)]),
                 metadata=token).written == 1
    with pytest.raises(grpc.RpcError) as info:
        write(P.WriteMetricsRequest(parent=parent, points=[P.MetricPoint(metric="m", step=1, value=1)]), metadata=token)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "XMC_METRICS_WRITES_PER_S" in info.value.details()
    assert MetricPoint.objects.count() == 1
