"""Deliveries claimed, sent and recorded in batches (services.deliver_many, what one deliver task
carries): the per-message rules still hold inside a batch, and workers racing over the same batch
send every message once."""
from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from experiments.models import Experiment
from notifications import outbox as notify_outbox
from notifications import services
from notifications.models import Delivery, DeliveryAttempt, DeliveryStatus, Event, EventType
from tests import factories
from tests.notifications.helpers import race
from tests.notifications.conftest import Receiver
from xmc.auth.identity import Identity
from django.utils import timezone

ALICE = factories.ALICE


def failures(n: int, *, creator: str = ALICE) -> list[Experiment]:
    """``n`` experiments with one WORK_UNIT_FAILED event each (not yet fanned out)."""
    exps = [factories.experiment(creator=creator) for _ in range(n)]
    Event.objects.bulk_create([Event(key=f"batch/{x.id}", type=EventType.WORK_UNIT_FAILED, xid=x.id, wid=1, eid=1,
                                     data={"state": "FAILED", "previousState": "RUNNING"}, create_time=timezone.now())
                               for x in exps])
    return exps


def subscribe(receiver: Receiver, **data: Any) -> int:
    created = services.create(Identity(ALICE), {"events": ["WORK_UNIT_FAILED"], "webhook": {"url": receiver.url},
                                                **data})
    receiver.secret = created.secret
    return created.subscription.id


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "enqueue", lambda ids, countdown=None: None)
    monkeypatch.setattr(notify_outbox, "enqueue", lambda ids, countdown=None: None)
    monkeypatch.setattr(notify_outbox, "after_commit", lambda callback: callback())


@pytest.mark.django_db
def test_it_holds_a_subscribers_rate_limit_in_a_batch_and_records_each_outcome(receiver, no_broker, settings) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 0.0
    subscribe(receiver, allMyExperiments=True, rateLimitPerHour=4)
    refused = Receiver(statuses=[500] * 10).start()
    try:
        services.create(Identity(ALICE), {"events": ["WORK_UNIT_FAILED"], "allMyExperiments": True,
                                          "webhook": {"url": refused.url}})
        failures(6)  # after the subscriptions: none hears of events from before it existed
        ids = services.fan_out_many(list(Event.objects.values_list("id", flat=True)))
        outcomes = services.deliver_many(ids)
    finally:
        refused.stop()

    assert len(ids) == 12
    assert Counter(o.action for o in outcomes.values()) == {"sent": 4, "postponed": 2, "failed": 6}
    assert len(receiver.requests) == 4 and all(r.verified for r in receiver.requests)
    assert len(refused.requests) == 6
    held = Delivery.objects.filter(status=DeliveryStatus.PENDING, attempts=0)
    assert held.count() == 2 and all(d.last_error.startswith("rate limit") for d in held)
    retrying = Delivery.objects.filter(status=DeliveryStatus.PENDING, attempts=1)
    assert retrying.count() == 6 and all(d.next_attempt_time > timezone.now() for d in retrying)
    assert DeliveryAttempt.objects.filter(ok=True).count() == 4
    assert DeliveryAttempt.objects.filter(ok=False, status_code=500).count() == 6


@pytest.mark.django_db(transaction=True)
def test_it_sends_every_message_once_when_workers_race_over_the_same_batch(receiver, no_broker, settings) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 0.0
    subscribe(receiver, allMyExperiments=True, rateLimitPerHour=1000)
    failures(40)
    ids = services.fan_out_many(list(Event.objects.values_list("id", flat=True)))
    errors = race(services.deliver_many, (ids, ids[::-1], ids[::3]))

    assert errors == []
    seen = Counter(r.headers["webhook-id"] for r in receiver.requests)
    assert len(seen) == 40 and set(seen.values()) == {1}
    assert set(Delivery.objects.values_list("status", "attempts")) == {(DeliveryStatus.DELIVERED, 1)}
    assert DeliveryAttempt.objects.count() == 40
