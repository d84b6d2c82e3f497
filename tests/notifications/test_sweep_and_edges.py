"""The sweep recovers what the broker lost and finds work units queued too long; odd input never gives a 500."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from delivery import sweep as sweeps
from notifications import sending, services, tasks
from notifications.models import Delivery, DeliveryStatus, Event
from tests import factories
from tests.notifications.helpers import fail, set_state
from tests.notifications.test_delivery import launched, webhook_sub
from workunits.choices import WorkUnitState
from workunits.models import WorkUnitExecution
from xmc.auth.identity import Identity
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db


def test_it_sends_by_the_sweep_the_events_whose_fan_out_never_reached_the_broker(receiver, outbox) -> None:
    exp = launched()
    webhook_sub(receiver, exp)
    fail(factories.work_unit(exp))
    outbox.fan_outs.clear()  # the broker was down: the fan-out task is lost
    outbox.pump()
    assert receiver.requests == [] and Event.objects.get().done is False
    Event.objects.update(create_time=timezone.now() - timedelta(minutes=1))
    sweeps.sweep()  # the one delivery sweep
    outbox.pump()
    assert len(receiver.requests) == 1 and receiver.requests[0].verified


def test_it_sends_by_the_sweep_the_deliveries_the_broker_lost(receiver, outbox) -> None:
    exp = launched()
    webhook_sub(receiver, exp)
    fail(factories.work_unit(exp))
    outbox.fan_outs, outbox.deliveries = outbox.fan_outs, []
    services.fan_out(outbox.fan_outs.pop())
    outbox.deliveries.clear()  # the deliver task is lost
    Delivery.objects.update(next_attempt_time=timezone.now() - timedelta(minutes=1),
                            not_before=timezone.now() - timedelta(minutes=1))
    sweeps.sweep()  # the one delivery sweep
    outbox.pump()
    assert Delivery.objects.get().status == DeliveryStatus.DELIVERED and len(receiver.requests) == 1


def test_it_tells_once_of_a_work_unit_waiting_in_the_queue_too_long(receiver, outbox) -> None:
    exp = launched()
    waiting, fresh = factories.work_unit(exp), factories.work_unit(exp)
    webhook_sub(receiver, exp, events=["WORK_UNIT_QUEUED_TOO_LONG"], queuedMinutes=30)
    set_state([waiting, fresh], WorkUnitState.SCHEDULING)
    old = int((timezone.now() - timedelta(minutes=31)).timestamp() * 1e9)
    WorkUnitExecution.objects.filter(work_unit=waiting).update(state_update_time_ns=old)
    tasks.sweep()
    outbox.pump()
    tasks.sweep()  # again: nothing new
    outbox.pump()
    assert len(receiver.requests) == 1
    body = receiver.requests[0].json
    assert body["type"] == "workUnit.queuedTooLong"
    assert [w["name"] for w in body["data"]["workUnits"]] == [f"experiments/{exp.id}/workUnits/{waiting.wid}"]
    assert body["data"]["workUnits"][0]["queuedMinutes"] == 30


def test_it_sends_nothing_to_a_disabled_subscription(receiver, outbox, settings) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 60
    exp = launched()
    sid = webhook_sub(receiver, exp)
    fail(factories.work_unit(exp))
    outbox.pump()
    from xmc.auth.identity import Identity

    services.update(Identity(factories.ALICE), sid, {"enabled": False})
    services.deliver(Delivery.objects.get().id, now=timezone.now() + timedelta(minutes=2))
    assert Delivery.objects.get().status == DeliveryStatus.SUPPRESSED and receiver.requests == []


@pytest.mark.parametrize("method,url,body", [
    ("GET", "/v1/subscriptions/abc", None),
    ("GET", "/v1/subscriptions/99999999999999999999999", None),
    ("PATCH", "/v1/subscriptions/1", {"events": []}),
    ("DELETE", "/v1/subscriptions/-1", None),
    ("POST", "/v1/subscriptions/1:test", None),
    ("POST", "/v1/subscriptions/1:rotateSecret", None),
    ("GET", "/v1/subscriptions/1/deliveries", None),
    ("PUT", "/v1/subscriptions", {}),
    ("POST", "/v1/subscriptions", {"events": ["WORK_UNIT_FAILED"], "allMyExperiments": True,
                                   "webhook": {"url": "http://" + "a" * 3000}}),
    ("POST", "/v1/subscriptions", {"events": ["WORK_UNIT_FAILED"], "allMyExperiments": True,
                                   "webhook": {"url": 5}}),
    ("POST", "/v1/subscriptions", {"events": ["WORK_UNIT_FAILED"], "allMyExperiments": True,
                                   "webhook": {"url": "http://[::1"}}),
    ("POST", "/v1/subscriptions", {"events": ["WORK_UNIT_FAILED"], "allMyExperiments": True,
                                   "webhook": {"url": "http://no-such-host.invalid/x"}}),
    ("POST", "/v1/subscriptions", {"events": ["WORK_UNIT_FAILED"], "allMyExperiments": True, "email": {},
                                   "rateLimitPerHour": True}),
    ("POST", "/v1/subscriptions", {"events": ["WORK_UNIT_FAILED"], "experiment": "experiments/" + "9" * 30,
                                   "email": {}}),
    ("POST", "/v1/subscriptions", {"events": [None], "allMyExperiments": True, "email": {}}),
    ("POST", "/v1/subscriptions", "\x00\xff"),
])
def test_it_answers_odd_input_in_the_error_shape_never_a_500(method: str, url: str, body: object) -> None:
    client = Client()
    data = "" if body is None else (body if isinstance(body, str) else json.dumps(body))
    r = client.generic(method, url, data, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {issue_token(factories.ALICE)}")
    assert 400 <= r.status_code < 500, r.content
    assert "error" in json.loads(r.content)


def test_it_answers_401_without_a_token() -> None:
    r = Client().get("/v1/subscriptions")
    assert r.status_code == 401 and json.loads(r.content)["error"]["status"] == "UNAUTHENTICATED"


def test_it_tells_by_the_sweep_of_an_experiment_whose_launch_completes_after_its_units_ended(receiver, outbox) -> None:
    from experiments import services as experiment_services
    from core import pb

    exp = factories.experiment()  # still LAUNCHING: ACTIVE although its only unit fails
    wu = factories.work_unit(exp)
    webhook_sub(receiver, exp, events=["EXPERIMENT_FINISHED"])
    fail(wu)
    outbox.pump()
    assert receiver.requests == []
    experiment_services.update_launch_state(exp.id, pb.status.ExperimentStatus.LaunchState.Value("COMPLETED"))
    tasks.sweep()
    outbox.pump()
    tasks.sweep()  # the same finish: the same key, nothing new
    outbox.pump()
    assert len(receiver.requests) == 1
    assert receiver.requests[0].json["data"]["stateCounts"] == {"FAILED": 1}


def test_it_sends_a_long_wait_as_hops_shorter_than_the_brokers_visibility_timeout(monkeypatch) -> None:
    from xmc.celery import app

    sent: list[dict] = []
    monkeypatch.setattr(app, "send_task", lambda name, **kw: sent.append({"name": name, **kw}))
    services.enqueue([7], countdown=8 * 3600)  # quiet hours until the morning
    services.enqueue([8], countdown=2.5)
    assert [(m["args"], m["countdown"], m["queue"]) for m in sent] == [([7], 600.0, "notifications"),
                                                                       ([8], 2.5, "notifications")]


@pytest.mark.django_db(transaction=True)
def test_it_looks_again_soon_at_a_message_whose_row_was_locked_when_it_arrived(
        receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher records that the broker took a message (an UPDATE of its row) while the worker
    that already received it claims the row: the worker must not drop it and leave it to the sweep."""
    import psycopg
    from django.db import connection

    from notifications import outbox as notify_outbox

    resent: list[tuple[list[int], float | None]] = []
    monkeypatch.setattr(notify_outbox, "enqueue", lambda ids, countdown=None: resent.append((list(ids), countdown)))
    monkeypatch.setattr(notify_outbox, "after_commit", lambda callback: None)  # the broker is the test
    sid = webhook_sub(receiver, launched())
    delivery = services.send_test(Identity(factories.ALICE), sid)
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as publisher:
        publisher.execute("SELECT id FROM notifications_delivery WHERE id = %s FOR UPDATE", [delivery.id])
        assert tasks.deliver.run(delivery.id) == "leased"
        assert resent == [([delivery.id], sending.LOCKED_RETRY_S + 0.5)]  # looked at again in a second
    assert receiver.requests == []
    assert tasks.deliver.run(delivery.id) == "sent"  # the lock is gone: sent
    assert len(receiver.requests) == 1 and Delivery.objects.get(id=delivery.id).status == DeliveryStatus.DELIVERED
