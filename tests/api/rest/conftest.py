"""The cast and helpers of the REST tests.

Alice owns an experiment with two work units and an artifact, built through
the real services (``tests.factories``); Bob is another researcher with no
role on it. ``api`` is Django's test client speaking to the URLconf
``tests.api.rest.urls`` (what ``xmc.urls`` mounts) with a bearer token.
Rate limiting is switched off except where a story turns it on.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from google.protobuf import empty_pb2
from google.protobuf.message import Message

from artifacts import services as artifact_services
from core import pb
from experiments.models import Experiment
from tests import factories
from tests.fixtures.people import ALICE, BOB, Api  # noqa: F401 - the one Api and cast, re-exported for the tests here
from workunits.models import StatusMessage, WorkUnit
from xmc.api import registry
from xmc.api.registry import Caller, invoke
from xmc.auth.identity import Identity


@pytest.fixture(autouse=True)
def _rest_urls(settings: Any) -> Iterator[None]:
    settings.XMC_RATE_LIMIT_PER_S = 0  # off; the throttle story turns it on
    with override_settings(ROOT_URLCONF="tests.api.rest.urls"):
        yield


def grpc_call(service: str, method: str, request: Message, email: str = ALICE) -> Message:
    """What the gRPC server does for a call: the same registry, the same handler."""
    return invoke(service, method, request, Caller(identity=Identity(email=email)))


@dataclass
class World:
    experiment: Experiment
    work_units: list[WorkUnit]
    artifact_name: str
    create_operation: str  # the name of work unit 1's CreateWorkUnit operation
    batch_operation: str = ""  # an experiment-level operation, when a story makes one
    done_operation: str = ""  # a finished one (a batch that matched no work unit)

    @property
    def xid(self) -> int:
        return self.experiment.id

    @property
    def wu1(self) -> str:
        return f"experiments/{self.xid}/workUnits/1"


@pytest.fixture
def world(db: None) -> World:
    """Alice's experiment "resnet sweep" with work units 1 and 2, an artifact and two status messages."""
    exp = factories.experiment(ALICE, title="resnet sweep", tags=["sweep"])
    wus = [factories.work_unit(exp, wid=1), factories.work_unit(exp, wid=2)]
    artifact = artifact_services.create_artifact(
        exp.id, 1, pb.artifact.Artifact(notes="final checkpoint", tags=["ckpt"], mime_type="application/octet-stream")
    )
    now = timezone.now()
    for wu, text in ((None, "experiment started"), (wus[0], "pulling image")):
        StatusMessage.objects.create(
            experiment=exp, work_unit=wu, execution_id=0 if wu is None else 1,
            content={"severity": "INFO", "userFacingText": text}, severity="INFO", create_time=now,
        )
    create_op = wus[0].operations.order_by("id").first()
    assert create_op is not None
    return World(exp, wus, artifact.name, create_op.name)


class FakeInvoke:
    """Stands in for `xmc.api.registry.invoke`: records each call, answers or raises what a story says."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Message, Caller]] = []
        self.response: Message = empty_pb2.Empty()
        self.error: BaseException | None = None

    def __call__(self, service: str, method: str, request: Message, caller: Caller) -> Message:
        self.calls.append((service, method, request, caller))
        if self.error is not None:
            raise self.error
        return self.response

    @property
    def request(self) -> Any:
        assert self.calls, "no RPC was invoked"
        return self.calls[-1][2]


@pytest.fixture
def fake_invoke(monkeypatch: pytest.MonkeyPatch) -> FakeInvoke:
    """Transport-only stories: the REST layer runs for real, the handler is a recorder."""
    fake = FakeInvoke()
    monkeypatch.setattr(registry, "invoke", fake)
    return fake
