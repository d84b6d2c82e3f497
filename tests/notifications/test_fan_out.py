"""The batched fan-out: every scope matched in one pass, coalescing within a batch, and exactly
one (event, subscription) record when several workers fan out the same events at once."""
from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from notifications import outbox as notify_outbox
from notifications import services
from notifications.models import Delivery, DeliveryEvent, Event, EventType
from tests import factories
from tests.notifications.helpers import race
from xmc.auth.identity import Identity

ALICE, BOB = factories.ALICE, factories.BOB


def subscribe(owner: str, **data: Any) -> int:
    data.setdefault("events", ["WORK_UNIT_FAILED"])
    data.setdefault("email", {})
    if data["email"] is None:  # another channel: another recipient
        del data["email"]
    return services.create(Identity(owner), data).subscription.id


def failed(exp: Any, wid: int) -> Event:
    return Event.objects.create(key=f"test/{exp.id}/{wid}", type=EventType.WORK_UNIT_FAILED, xid=exp.id, wid=wid,
                                eid=1, data={"state": "FAILED"}, create_time=timezone.now())


@pytest.mark.django_db
def test_it_matches_every_scope_in_one_batch_and_coalesces_per_experiment(settings, monkeypatch) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 60.0
    monkeypatch.setattr(services, "enqueue", lambda ids, countdown=None: None)
    monkeypatch.setattr(notify_outbox, "enqueue", lambda ids, countdown=None: None)
    mine, bobs = factories.experiment(title="mine", creator=ALICE), factories.experiment(title="bobs", creator=BOB)
    one = subscribe(ALICE, experiment=f"experiments/{mine.id}")
    all_mine = subscribe(ALICE, allMyExperiments=True, webhook={"url": "http://127.0.0.1:9/all"}, email=None)
    by_filter = subscribe(BOB, filter='title = "bobs"')
    finished_only = subscribe(ALICE, experiment=f"experiments/{mine.id}", events=["EXPERIMENT_FINISHED"])
    events = [failed(mine, w) for w in (1, 2, 3)] + [failed(bobs, w) for w in (1, 2)]

    created = services.fan_out_many([e.id for e in events])

    per_sub = {sid: set(Delivery.objects.filter(subscription_id=sid).values_list("id", flat=True))
               for sid in (one, all_mine, by_filter, finished_only)}
    assert {sid: len(ids) for sid, ids in per_sub.items()} == {one: 1, all_mine: 1, by_filter: 1, finished_only: 0}
    assert sorted(created) == sorted(per_sub[one] | per_sub[all_mine] | per_sub[by_filter])
    carried = {sid: DeliveryEvent.objects.filter(subscription_id=sid).count() for sid in per_sub}
    assert carried == {one: 3, all_mine: 3, by_filter: 2, finished_only: 0}  # one message per experiment
    assert Event.objects.filter(done=False).count() == 0
    assert services.fan_out_many([e.id for e in events]) == []  # again: nothing new
    assert DeliveryEvent.objects.count() == 8


@pytest.mark.django_db(transaction=True)
def test_it_records_each_pair_once_when_workers_fan_out_the_same_events_at_once(monkeypatch) -> None:
    monkeypatch.setattr(services, "enqueue", lambda ids, countdown=None: None)
    monkeypatch.setattr(notify_outbox, "enqueue", lambda ids, countdown=None: None)
    exps = [factories.experiment(creator=ALICE) for _ in range(3)]
    subs = [subscribe(ALICE, experiment=f"experiments/{x.id}") for x in exps] + [subscribe(ALICE, allMyExperiments=True, webhook={"url": "http://127.0.0.1:9/all"}, email=None)]
    ids = [failed(exps[i % 3], i + 1).id for i in range(60)]
    errors = race(services.fan_out_many, (ids, ids[::-1], ids[::2], ids[1::2]))
    assert errors == []
    assert Event.objects.filter(done=False).count() == 0
    assert DeliveryEvent.objects.count() == 60 * 2  # its experiment's subscription and the "mine" one
    assert (DeliveryEvent.objects.values("event_id", "subscription_id").distinct().count()
            == DeliveryEvent.objects.count())
    assert set(DeliveryEvent.objects.values_list("subscription_id", flat=True)) == set(subs)
