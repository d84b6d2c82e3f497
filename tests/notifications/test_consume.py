"""The notifications queue's tasks run through the delivery floor's one worker-side wrapper
(``delivery.consume.consume_many``): a batch is claimed in one statement, a copy whose rows another
live run holds is dropped, and a database error is retried or given up by consume's one path."""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError
from django.utils import timezone

from delivery import leases
from notifications import outbox as notify_outbox
from notifications import services, tasks
from notifications.models import Delivery, DeliveryStatus, Event
from tests.notifications.conftest import Receiver
from tests.notifications.test_batch_delivery import failures, subscribe

pytestmark = pytest.mark.django_db


@pytest.fixture
def resent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], float | None]]:
    """What the tasks hand back to the queue (recorded: the broker is not the test)."""
    sent: list[tuple[list[int], float | None]] = []
    monkeypatch.setattr(notify_outbox, "enqueue", lambda ids, countdown=None: sent.append((list(ids), countdown)))
    monkeypatch.setattr(notify_outbox, "after_commit", lambda callback: None)
    return sent


@pytest.fixture
def task_request() -> Iterator[Any]:
    """The deliver task as a worker runs it: a request with a task id (the claim's token) and a retry count."""
    tasks.deliver.push_request(id="deliver-1", retries=0, called_directly=False)
    yield tasks.deliver.request
    tasks.deliver.pop_request()


def deliveries(receiver: Receiver, n: int) -> list[int]:
    subscribe(receiver, allMyExperiments=True, rateLimitPerHour=1000)
    failures(n)
    return services.fan_out_many(list(Event.objects.values_list("id", flat=True)))


def test_it_drops_through_the_shared_claim_a_deliver_copy_whose_rows_another_live_run_holds(
        receiver: Receiver, resent: list[Any]) -> None:
    ids = deliveries(receiver, 4)
    held = ids[:2]
    assert leases.claim_many(Delivery, held, "another-run", seconds=60) == held

    assert tasks.deliver.run(ids) == "leased,sent"
    assert len(receiver.requests) == 2
    assert set(Delivery.objects.filter(id__in=held).values_list("status", "attempts", "claimed_by")) == {
        (DeliveryStatus.PENDING, 0, "another-run")}
    assert resent == []  # left to the live run (and the sweep, should it die), not looked at again

    Delivery.objects.filter(id__in=held).update(claimed_until=timezone.now() - timedelta(seconds=1))  # it died
    assert tasks.deliver.run(ids) == "done,sent"  # its rows are taken over; the sent ones are done
    seen = Counter(r.headers["webhook-id"] for r in receiver.requests)
    assert len(seen) == 4 and set(seen.values()) == {1}
    assert set(Delivery.objects.values_list("status", "claimed_until")) == {(DeliveryStatus.DELIVERED, None)}


def test_it_drops_a_fan_out_copy_whose_events_another_live_run_holds_and_takes_them_over_once_its_claim_ran_out(
        receiver: Receiver, resent: list[Any]) -> None:
    subscribe(receiver, allMyExperiments=True)
    failures(2)
    events = sorted(Event.objects.values_list("id", flat=True))
    assert leases.claim_many(Event, events, "another-run", seconds=60) == events

    tasks.fan_out.run(events)
    assert not Delivery.objects.exists() and not Event.objects.filter(done=True).exists()

    Event.objects.update(claimed_until=timezone.now() - timedelta(seconds=1))  # the other run died
    tasks.fan_out.run(events)
    assert Delivery.objects.count() == 2
    assert set(Event.objects.values_list("done", "claimed_until")) == {(True, None)}


def test_it_retries_a_database_error_in_a_batch_with_jittered_backoff_holding_the_rows_past_the_countdown(
        receiver: Receiver, resent: list[Any], task_request: Any, monkeypatch: pytest.MonkeyPatch,
        settings: Any) -> None:
    ids = deliveries(receiver, 3)
    retried: list[dict[str, Any]] = []

    def retry(**kw: Any) -> Exception:  # what Celery's retry is told; its publish is the worker test's
        retried.append(kw)
        return RuntimeError("retry")

    def refused(*args: Any, **kw: Any) -> Any:
        raise OperationalError("the server closed the connection unexpectedly")

    monkeypatch.setattr(tasks.deliver, "retry", retry)
    monkeypatch.setattr(services, "deliver_many", refused)
    task_request.retries = 3
    with pytest.raises(RuntimeError):
        tasks.deliver.run(ids)
    [plan] = retried
    assert 4.0 <= plan["countdown"] <= 8.0 and plan["max_retries"] == tasks.DB_MAX_RETRIES  # jittered(3): [4, 8]
    assert isinstance(plan["exc"], OperationalError)
    rows = Delivery.objects.filter(id__in=ids)
    floor = timezone.now() + timedelta(seconds=plan["countdown"] + settings.XMC_NOTIFY_LEASE_S - 1)
    assert all(r.claimed_by == "deliver-1" and r.claimed_until > floor for r in rows)
    assert notify_outbox.due_deliveries(timezone.now() + timedelta(seconds=10)) == []  # no copy from the sweep


def test_it_leaves_a_batch_that_runs_out_of_database_retries_unclaimed_for_the_sweep(
        receiver: Receiver, resent: list[Any], task_request: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    ids = deliveries(receiver, 3)

    def refused(*args: Any, **kw: Any) -> Any:
        raise OperationalError("the server closed the connection unexpectedly")

    monkeypatch.setattr(services, "deliver_many", refused)
    task_request.retries = tasks.DB_MAX_RETRIES  # the last try
    with caplog.at_level(logging.ERROR, logger="notifications.tasks"):
        tasks.deliver.run(ids)
    assert [r.message for r in caplog.records if r.name == "notifications.tasks"] == ["notifications.gave_up"]
    rows = Delivery.objects.filter(id__in=ids)
    assert all(r.claimed_until is None and not r.done and r.status == DeliveryStatus.PENDING for r in rows)
    assert notify_outbox.due_deliveries(timezone.now() + timedelta(seconds=10)) == ids  # the sweep sends them


@pytest.mark.django_db(transaction=True)
def test_it_looks_again_soon_at_fan_out_events_whose_rows_were_locked_when_the_task_arrived(
        receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher records that the broker took the fan-out's message (an UPDATE of the event rows)
    while the worker that already received it claims them: the events are not left to the sweep."""
    import psycopg
    from django.db import connection

    again: list[tuple[list[int], float | None]] = []
    monkeypatch.setattr(notify_outbox, "enqueue_fan_out",
                        lambda ids, countdown=None: again.append((list(ids), countdown)) if ids else None)
    monkeypatch.setattr(notify_outbox, "after_commit", lambda callback: None)
    subscribe(receiver, allMyExperiments=True)
    failures(2)
    events = sorted(Event.objects.values_list("id", flat=True))
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as publisher:
        publisher.execute("SELECT id FROM notifications_event WHERE id = %s FOR UPDATE", [events[0]])
        tasks.fan_out.run(events)
        assert again == [([events[0]], leases.LOCKED_RETRY_S)]  # looked at again in a second
        assert list(Event.objects.filter(done=True).values_list("id", flat=True)) == events[1:]
    tasks.fan_out.run([events[0]])  # the lock is gone: fanned out
    assert not Event.objects.filter(done=False).exists() and Delivery.objects.count() == 2
