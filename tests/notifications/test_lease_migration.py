"""Upgrading to the delivery floor's lease columns keeps every event and delivery, in flight or not."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from notifications import services
from notifications.models import Delivery, DeliveryStatus, Event
from tests import factories

BEFORE = [("notifications", "0005_work_unit_idle")]


@pytest.mark.django_db(transaction=True)
def test_it_keeps_every_row_of_an_upgrade_with_messages_in_flight_and_still_sends_what_was_due() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    now, long_ago = timezone.now(), timezone.now() - timedelta(minutes=5)
    try:
        sub = old.get_model("notifications", "Subscription").objects.create(
            owner=factories.ALICE, scope="MINE", events=["WORK_UNIT_FAILED"], channel="WEBHOOK",
            url="https://hooks.example/x", create_time=long_ago, update_time=long_ago)
        events = old.get_model("notifications", "Event").objects
        told = events.create(key="told", type="WORK_UNIT_FAILED", create_time=long_ago, fanned_out=True).id
        stranded = events.create(key="stranded", type="WORK_UNIT_FAILED", create_time=long_ago).id
        deliveries = old.get_model("notifications", "Delivery").objects

        def delivery(status: str, **fields: object) -> int:
            return deliveries.create(subscription=sub, type="WORK_UNIT_FAILED", status=status, not_before=long_ago,
                                     next_attempt_time=long_ago, create_time=long_ago, **fields).id

        pending = delivery("PENDING")
        sending = delivery("DELIVERING", attempts=1, lease_until=now + timedelta(minutes=1))
        crashed = delivery("DELIVERING", attempts=1, lease_until=long_ago)
        finished = {delivery(s, attempts=1) for s in ("DELIVERED", "DEAD", "SUPPRESSED")}
    finally:
        call_command("migrate", verbosity=0)  # the upgrade

    assert Event.objects.count() == 2 and Delivery.objects.count() == 6
    assert Event.objects.get(id=told).done and not Event.objects.get(id=stranded).done
    assert Delivery.objects.get(id=sending).claimed_until == now + timedelta(minutes=1)  # its worker keeps it
    assert set(Delivery.objects.filter(done=True).values_list("id", flat=True)) == finished
    assert Delivery.objects.get(id=pending).status == DeliveryStatus.PENDING
    # What was in flight still reaches the subscriber: the one sweep picks up the stranded event,
    # the waiting message and the one whose worker died, and leaves the live claim alone.
    assert services.stranded_events(timezone.now()) == [stranded]
    assert services.due_deliveries(timezone.now()) == sorted([pending, crashed])
