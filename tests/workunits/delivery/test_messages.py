"""The generic outbox (``workunits.delivery``): lifecycle events, closes and resumption runs.

Each message is a row before it is a message; a lost or refused send is swept
again; a worker claims the row, so a copy is dropped while the claim is live
and taken over once it ran out; the last failed try is dead-lettered, beside
the actuator's dead letters in the admin.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError
from django.test import Client
from django.utils import timezone

from lifecycle import events
from lifecycle import tasks as lifecycle_tasks
from tests.fixtures.people import PASSWORD, new_user
from tests.lifecycle import brokers
from delivery import leases
from workunits import delivery, scheduling
from workunits.models import DeadLetter, OutboxMessage
from xmc.celery import app

pytestmark = pytest.mark.django_db

EVENT = events.LifecycleEvent(xid=1, wid=2, eid=1, old_state="SCHEDULING", new_state="RUNNING", event_time_ns=5)


class Retry(Exception):
    pass


@dataclass
class FakeRequest:
    id: str
    retries: int = 0


@dataclass
class FakeTask:
    """What ``consume`` reads of a bound Celery task."""

    id: str = "task-1"
    retries: int = 0
    name: str = "xmc.test.task"
    retried: list[float] = field(default_factory=list)

    @property
    def request(self) -> FakeRequest:
        return FakeRequest(self.id, self.retries)

    def retry(self, *, exc: Exception, countdown: float, max_retries: int) -> Exception:
        self.retried.append(countdown)
        return Retry(str(exc))


def message() -> OutboxMessage:
    return OutboxMessage.objects.create(queue="lifecycle", task_name=events.TASK_NAME, args=[events.encode(EVENT)],
                                        create_time=timezone.now())


@pytest.fixture(autouse=True)
def _clean_queues() -> None:
    for q in ("lifecycle", "resumption"):
        brokers.purge(q)


def test_it_writes_an_event_as_a_row_first_then_a_message_naming_it() -> None:
    assert events.publish(EVENT)
    row = OutboxMessage.objects.get()
    assert (row.queue, row.task_name, row.done) == ("lifecycle", events.TASK_NAME, False)
    assert row.dispatched_time is not None
    [(name, args)] = brokers.drain("lifecycle")
    assert name == events.TASK_NAME and events.decode(args[0]) == EVENT


def test_it_sends_by_the_sweep_an_event_the_broker_refused(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    real = app.send_task
    monkeypatch.setattr(app, "send_task", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("redis down")))
    assert events.publish(EVENT)  # the row is written: nothing is lost
    row = OutboxMessage.objects.get()
    assert row.dispatched_time is None and row.dispatch_attempts == 1
    monkeypatch.setattr(app, "send_task", real)
    settings.XMC_OUTBOX_SWEEP_MIN_AGE_S = 0
    assert delivery.sweep_messages() == 1
    assert len(brokers.drain("lifecycle")) == 1
    assert delivery.sweep_messages() == 0  # sent: its lease runs now


def test_it_sends_a_message_redis_lost_again_after_its_lease(settings: Any) -> None:
    events.publish(EVENT)
    brokers.purge("lifecycle")  # Redis restarted empty
    assert delivery.sweep_messages() == 0
    OutboxMessage.objects.update(dispatched_time=timezone.now() - timedelta(seconds=settings.XMC_OPERATION_LEASE_S + 1))
    assert delivery.sweep_messages() == 1
    assert len(brokers.drain("lifecycle")) == 1


def test_it_drops_a_copy_while_another_run_holds_the_claim_and_takes_it_over_after() -> None:
    row = message()
    ran: list[str] = []
    assert leases.claim(OutboxMessage, row.id, "other-worker")
    delivery.consume(FakeTask(id="copy"), row.id, lambda: ran.append("copy"), retry_for=(), max_retries=3)
    assert ran == [] and not OutboxMessage.objects.get(id=row.id).done
    OutboxMessage.objects.filter(id=row.id).update(claimed_until=timezone.now() - timedelta(seconds=1))  # it died
    delivery.consume(FakeTask(id="copy"), row.id, lambda: ran.append("copy"), retry_for=(), max_retries=3)
    row.refresh_from_db()
    assert ran == ["copy"] and row.done and row.attempts == 1 and row.claimed_until is None
    delivery.consume(FakeTask(id="late"), row.id, lambda: ran.append("late"), retry_for=(), max_retries=3)
    assert ran == ["copy"]  # done: a late copy does nothing


def test_it_keeps_the_claim_of_a_retry_past_its_countdown_and_dead_letters_the_last_try() -> None:
    row = message()

    def fails() -> None:
        raise DatabaseError("connection lost")

    task = FakeTask(id="t")
    with pytest.raises(Retry):
        delivery.consume(task, row.id, fails, retry_for=(DatabaseError,), max_retries=2, backoff=lambda n: 30.0)
    row.refresh_from_db()
    assert row.claimed_by == "t" and row.claimed_until > timezone.now() + timedelta(seconds=30)
    assert not leases.claim(OutboxMessage, row.id, "someone-else")
    task.retries = 2  # the last try
    delivery.consume(task, row.id, fails, retry_for=(DatabaseError,), max_retries=2)
    row.refresh_from_db()
    assert row.done and "connection lost" in row.error
    dead = DeadLetter.objects.get()
    assert (dead.task_name, dead.message_id, dead.error_code, dead.attempts) == \
        ("xmc.test.task", row.id, "DEADLINE_EXCEEDED", 3)


def test_it_dead_letters_an_unexpected_error_at_once() -> None:
    row = message()
    delivery.consume(FakeTask(), row.id, lambda: 1 / 0, retry_for=(DatabaseError,), max_retries=5)
    assert OutboxMessage.objects.get(id=row.id).done
    assert DeadLetter.objects.get().error_code == "INTERNAL"


def test_it_has_the_lifecycle_consumer_handle_an_event_once_whatever_the_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    handled: list[events.LifecycleEvent] = []
    monkeypatch.setattr("lifecycle.services.handle_event", handled.append)
    events.publish(EVENT)
    row = OutboxMessage.objects.get()
    [(_, args)] = brokers.drain("lifecycle")
    for _ in range(3):  # the message, a sweep's re-send, Redis's own redelivery
        lifecycle_tasks.handle_event.apply(args=args, kwargs={"delivery_id": row.id})
    assert handled == [EVENT]
    assert OutboxMessage.objects.get(id=row.id).done


def test_it_dead_letters_a_malformed_event_and_does_not_retry_it() -> None:
    row = OutboxMessage.objects.create(queue="lifecycle", task_name=events.TASK_NAME, args=["not base64!"],
                                       create_time=timezone.now())
    lifecycle_tasks.handle_event.apply(args=["not base64!"], kwargs={"delivery_id": row.id})
    assert OutboxMessage.objects.get(id=row.id).done
    assert DeadLetter.objects.get().error_code == "INVALID_ARGUMENT"


def test_it_records_a_resumes_run_in_the_outbox(django_capture_on_commit_callbacks: Any) -> None:
    scheduling.pause(reason="maintenance", by="ops@example.com")
    with django_capture_on_commit_callbacks(execute=True):
        result = scheduling.resume(by="ops@example.com", batch_size=10)
    row = OutboxMessage.objects.get(task_name="xmc.resumption.run")
    assert row.args == [str(result.run_id), 10] and row.dispatched_time is not None
    [(name, args)] = brokers.drain("resumption")
    assert (name, args) == ("xmc.resumption.run", [str(result.run_id), 10])


def test_it_shows_messages_and_their_dead_letters_in_the_admin_and_requeues_them(
    client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    new_user("olivia", is_superuser=True)
    assert client.login(username="olivia", password=PASSWORD)
    row = message()
    delivery.dead_letter(row.id, events.TASK_NAME, "DEADLINE_EXCEEDED", "MLRun unavailable", 51)
    assert client.get("/admin/workunits/outboxmessage/").status_code == 200
    assert client.get(f"/admin/workunits/outboxmessage/{row.id}/change/").status_code == 200
    page = client.get("/admin/workunits/deadletter/").content.decode()
    assert events.TASK_NAME in page and "DEADLINE_EXCEEDED" in page
    dead = DeadLetter.objects.get()
    assert client.get(f"/admin/workunits/deadletter/{dead.id}/change/").status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/admin/workunits/deadletter/", {"action": "requeue_dead_letters",
                                                                "_selected_action": [dead.id]})
    assert response.status_code == 302
    row.refresh_from_db()
    assert not row.done and row.error == ""
    assert len(brokers.drain("lifecycle")) == 1

