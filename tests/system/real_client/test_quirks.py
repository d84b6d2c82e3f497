"""The real client's quirks against XMC (client contract 1.4, 0.6, 8 steps 1 and 11, appendix A).

What reaches the server (which RPCs, in which order, with which identity),
callers that are refused, an unknown XID, and the endless paging loop of
``list_all_work_units()`` that rate limiting has to survive.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.system.real_client.conftest import ALICE, Call, Client

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_sees_the_launch_sequence_with_alices_verified_and_asserted_email(
    alice_client: Client, rpc_log: list[Call]
) -> None:
    alice_client.python(
        """
        from xmanager import xm, xm_cloud
        from xmanager.xm_local import executables
        experiment = xm_cloud.create_experiment(experiment_title="recorded")
        job = xm.Job(
            executable=executables.GoogleContainerRegistryImage(name="t", image_path="gcr.io/proj/t:v1"),
            executor=xm_cloud.KubernetesJobExecutor(requirements=xm.JobRequirements(cpu=1, memory=xm.GiB)),
            name="t",
        )
        with experiment:
            experiment.add(job, settings=xm_cloud.WorkUnitSettings())
            experiment.add(job, settings=xm_cloud.WorkUnitSettings())
        report({"id": experiment.id})
        """
    ).ok()

    methods = [call.method for call in rpc_log]
    # Contract 2: the launch-state update comes before (or among) the work units.
    assert methods[:3] == [
        "ExperimentStateService/CreateExperiment",
        "ExperimentStateService/CreateArtifact",
        "ExperimentStateService/UpdateExperimentLaunchState",
    ] or methods[:2] == ["ExperimentStateService/CreateExperiment", "ExperimentStateService/CreateArtifact"]
    assert sorted(methods[2:]) == sorted(
        ["ExperimentStateService/UpdateExperimentLaunchState"] + ["ExperimentStateService/CreateWorkUnit"] * 2
    )
    assert not [m for m in methods if m.startswith("Operations/")]  # contract 0.1
    assert {(call.email, call.asserted_email) for call in rpc_log} == {(ALICE, ALICE)}
    # Contract 2.4: the client numbers its work units 1, 2 in add() order.
    assert sorted(call.request.work_unit_id for call in rpc_log if call.method.endswith("/CreateWorkUnit")) == [1, 2]


@pytest.mark.parametrize(
    ("token", "why"),
    [("opaque-tok-123", "an opaque token is not ours"), (None, "no token at all")],
    ids=["opaque-token", "no-token"],
)
def test_it_refuses_a_client_whose_email_is_only_asserted(
    make_client: Callable[..., Client], token: str | None, why: str
) -> None:
    # Contract 1.4 rows 2 and 3: the client needs XMC_USER_EMAIL to even start.
    client = make_client(None, token=token) if token else make_client(None)
    run = client.python(
        """
        import grpc
        from xmanager import xm_cloud
        try:
            xm_cloud.create_experiment()
        except grpc.RpcError as exc:
            report({"code": exc.code().name, "details": exc.details()})
        """,
        XMC_USER_EMAIL="bob@example.com",
    ).ok()
    assert run.result["code"] == "UNAUTHENTICATED", why


def test_it_answers_permission_denied_for_an_unknown_experiment(alice_client: Client) -> None:
    # Permission first (AIP-211): a caller who could not read it learns nothing about its existence.
    run = alice_client.python(
        """
        import grpc
        from xmanager import xm_cloud
        try:
            xm_cloud.get_experiment(987654321)
        except grpc.RpcError as exc:
            report({"code": exc.code().name, "details": exc.details()})
        """
    ).ok()
    assert run.result["code"] == "PERMISSION_DENIED"
    assert "987654321" in run.result["details"]


def test_it_survives_list_all_work_units_which_never_stops_paging(
    make_client: Callable[..., Client],
    fresh_email: Callable[[str], str],
    grpc_target: str,
    alice_client: Client,
    settings: Any,
) -> None:
    # Contract 0.6: the loop compares next_page_token with None, so it never ends
    # on its own. A watchdog thread gives it 30 s; the per-identity rate limit
    # must end it first with RESOURCE_EXHAUSTED, and the server must stay healthy.
    # A small bucket (read by the server on every call) so even a slow machine's
    # client outruns the refill within a second or two.
    settings.XMC_RATE_LIMIT_BURST = 40
    settings.XMC_RATE_LIMIT_PER_S = 5
    hammer = make_client(fresh_email("hammer"))  # its own rate-limit bucket
    run = hammer.python(
        """
        import os, threading, time
        import grpc
        from xmanager import xm_cloud
        exp = xm_cloud.create_experiment(experiment_title="paging forever")
        calls = []
        original = exp._experiment_state_stub.search_work_units
        def counted(request):
            calls.append(request.page_token)
            return original(request)
        exp._experiment_state_stub.search_work_units = counted

        outcome = {}
        def page_forever():
            started = time.monotonic()
            try:
                exp.list_all_work_units()
                outcome["ended"] = "returned"
            except grpc.RpcError as exc:
                outcome["ended"] = exc.code().name
            outcome["seconds"] = time.monotonic() - started

        worker = threading.Thread(target=page_forever, daemon=True)
        worker.start()
        worker.join(30)
        report({"ended": outcome.get("ended", "still paging after 30 s"), "calls": len(calls),
                "tokens": sorted(set(calls)), "seconds": outcome.get("seconds")})
        os._exit(0)
        """,
        timeout=90,
    ).ok()

    print("list_all_work_units:", run.result)  # calls and seconds until the limit hit (-s shows it)
    assert run.result["ended"] == "RESOURCE_EXHAUSTED"
    assert run.result["tokens"] == [""]  # the same first page, over and over
    assert run.result["calls"] >= 30  # the burst, minus the calls made before the loop
    # The server is fine, and other callers never noticed.
    with grpc.insecure_channel(grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    alice_client.python(
        """
        from xmanager import xm_cloud
        report({"id": xm_cloud.create_experiment().id})
        """
    ).ok()


def test_it_serves_a_client_that_tried_tls_first_and_fell_back_to_plaintext(alice_client: Client) -> None:
    # Contract 1.1: a bare host:port means TLS; against our plaintext port the
    # handshake fails, and XMC_INSECURE_GRPC=1 makes the client retry in plaintext
    # after 5 s. The garbage TLS hello must not hurt the server.
    run = alice_client.python(
        """
        import time
        from xmanager import xm_cloud
        started = time.monotonic()
        exp = xm_cloud.create_experiment(experiment_title="after tls")
        report({"author": exp.author, "seconds": time.monotonic() - started})
        """,
        XMANAGER_ENDPOINT=alice_client.grpc_target,
        XMC_INSECURE_GRPC="1",
    ).ok()
    assert run.result["author"] == ALICE
    assert run.result["seconds"] >= 4.5
