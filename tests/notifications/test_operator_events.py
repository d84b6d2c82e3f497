"""Staff hear when work waits for a worker past XMC_DEGRADED_AFTER_S (issue 38, item 2): OPERATOR_* events."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from core.errors import PermissionDenied
from notifications import services, sources
from notifications.models import Event
from tests import factories
from tests.fixtures.people import new_user
from workunits import services as wu_services
from workunits.models import Operation
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db
KIND = "OPERATOR_DELIVERY_DEGRADED"


def waiting_create(seconds: float) -> int:
    exp = factories.experiment()
    create = wu_services.create_work_unit(exp.id, factories.work_unit_message()).id
    Operation.objects.filter(id=create).update(create_time=timezone.now() - timedelta(seconds=seconds))
    return create


def test_it_lets_only_staff_subscribe_to_operator_events() -> None:
    with pytest.raises(PermissionDenied, match=KIND):
        services.create(Identity(factories.ALICE), {"events": [KIND], "email": {}})


def test_it_tells_staff_once_per_backlog_when_work_waits_for_a_worker(receiver: Any, outbox: Any, settings: Any) -> None:
    settings.XMC_DEGRADED_AFTER_S = 120
    new_user("olivia", is_staff=True)
    created = services.create(Identity("olivia@example.com", is_staff=True),
                              {"events": [KIND], "webhook": {"url": receiver.url}})
    receiver.secret = created.secret
    waiting_create(60)
    assert sources.scan_delivery_degraded() == []  # under the threshold: nothing to say
    create = waiting_create(300)
    (first,) = sources.scan_delivery_degraded()
    assert sources.scan_delivery_degraded() == [first]  # the same backlog: the same event
    assert Event.objects.filter(type=KIND).count() == 1
    services.enqueue_fan_out([first])
    outbox.pump()
    (request,) = receiver.requests
    assert request.verified
    body = request.json
    assert body["type"] == "operator.deliveryDegraded"
    assert body["data"]["queue"] == "actuator" and body["data"]["oldestPendingSeconds"] >= 300
    services.enqueue_fan_out(sources.scan_delivery_degraded())
    outbox.pump()
    assert len(receiver.requests) == 1  # told once
    wu_services.complete_operation(create)  # the worker is back; the younger create alone is under the threshold
    assert sources.scan_delivery_degraded() == []
