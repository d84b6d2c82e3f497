"""How far behind the workers are: the age of each queue's oldest row no worker holds (issue 38, item 2)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests import factories
from delivery import leases
from workunits import delivery, scheduling, services
from workunits.models import Operation, OutboxMessage

pytestmark = pytest.mark.django_db


def created_ago(op_id: int, seconds: float) -> None:
    Operation.objects.filter(id=op_id).update(create_time=timezone.now() - timedelta(seconds=seconds))


def test_it_is_zero_for_every_queue_when_nothing_waits() -> None:
    assert delivery.oldest_pending() == {"actuator": 0.0, "lifecycle": 0.0, "resumption": 0.0, "notifications": 0.0}


def test_it_ages_a_create_no_worker_took() -> None:
    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    created_ago(create, 300)
    assert 299 < delivery.oldest_pending()["actuator"] < 310


def test_it_leaves_out_work_a_worker_holds_or_finished() -> None:
    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    created_ago(create, 300)
    assert leases.claim(Operation, create, "worker-1", seconds=60)  # retrying: a worker is on it
    assert delivery.oldest_pending()["actuator"] == 0.0
    Operation.objects.filter(id=create).update(claimed_until=timezone.now() - timedelta(seconds=1))
    assert delivery.oldest_pending()["actuator"] > 299  # its worker died: the claim ran out
    services.complete_operation(create)
    assert delivery.oldest_pending()["actuator"] == 0.0


def test_it_leaves_out_creates_held_while_scheduling_is_paused() -> None:
    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    Operation.objects.filter(id=create).update(dispatched_time=timezone.now())
    created_ago(create, 300)
    scheduling.pause(by="olivia@example.com", reason="cluster upgrade")
    assert delivery.oldest_pending()["actuator"] == 0.0


def test_it_ages_messages_per_queue() -> None:
    OutboxMessage.objects.create(queue="lifecycle", task_name="x", args=[],
                                 create_time=timezone.now() - timedelta(seconds=200))
    ages = delivery.oldest_pending()
    assert 199 < ages["lifecycle"] < 210 and ages["actuator"] == 0.0
