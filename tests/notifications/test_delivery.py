"""Delivery against real receivers: signed webhooks verified with the standardwebhooks library,
emails through a real SMTP server, Slack blocks; exactly once per event and subscription,
retries with the same webhook-id, dead letters, the circuit breaker, ACLs at send time,
coalescing, rate limits and quiet hours."""
from __future__ import annotations

from datetime import time as dtime
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from experiments.models import Experiment
from notifications import services
from notifications.models import Delivery, DeliveryAttempt, DeliveryStatus, Event
from tests import factories
from tests.fixtures.people import new_user
from tests.notifications.helpers import fail, set_state
from workunits import hooks
from workunits.choices import WorkUnitState
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db
ALICE, BOB = factories.ALICE, factories.BOB
LATER = timedelta(hours=2)


def subscribe(owner: str = ALICE, **data: Any) -> tuple[int, str | None]:
    data.setdefault("events", ["WORK_UNIT_FAILED"])
    created = services.create(Identity(owner), data)
    return created.subscription.id, created.secret


def webhook_sub(receiver, exp: Experiment, owner: str = ALICE, **data: Any) -> int:
    sid, secret = subscribe(owner, experiment=f"experiments/{exp.id}", webhook={"url": receiver.url}, **data)
    receiver.secret = secret
    return sid


def launched(**kw: Any) -> Experiment:
    exp = factories.experiment(**kw)
    Experiment.objects.filter(id=exp.id).update(launch_state="COMPLETED")
    return exp


def test_it_gives_exactly_one_verified_delivery_per_subscription_for_a_failed_work_unit(receiver, smtp, outbox) -> None:
    exp = launched()
    wu, _other = factories.work_unit(exp), factories.work_unit(exp)
    webhook_sub(receiver, exp)
    subscribe(experiment=f"experiments/{exp.id}", email={})
    transitions = fail(wu)
    hooks.on_transitions_committed(transitions)  # the hook runs twice (a redelivered flush)
    outbox.fan_outs.extend(outbox.fan_outs)  # and each fan-out is delivered twice
    outbox.pump()
    for event in Event.objects.all():
        services.fan_out(event.id)  # again, by hand: nothing new
    outbox.pump()
    assert len(receiver.requests) == 1
    request = receiver.requests[0]
    assert request.verified, request.error
    assert request.headers["webhook-id"].startswith("msg_")
    body = request.json
    assert body["type"] == "workUnit.failed" and body["schemaVersion"] == 1
    assert body["data"]["experiment"]["name"] == f"experiments/{exp.id}"
    assert body["data"]["count"] == 1
    assert body["data"]["workUnits"] == [{"name": f"experiments/{exp.id}/workUnits/{wu.wid}", "executionId": 1,
                                          "state": "FAILED", "previousState": "INITIALIZING", "jobName": "trainer",
                                          "url": f"http://127.0.0.1:8000/experiments/{exp.id}/workUnits/{wu.wid}"}]
    assert len(smtp.messages) == 1
    assert "1 work unit failed" in smtp.messages[0]["Subject"]
    assert f"/experiments/{exp.id}/workUnits/{wu.wid}" in smtp.messages[0].get_payload()
    assert "/v1/" not in smtp.messages[0].get_payload()  # the page, not the REST resource
    assert Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 2


def test_it_retries_with_backoff_sending_the_same_webhook_id_and_body(receiver, outbox) -> None:
    exp = launched()
    wu = factories.work_unit(exp)
    webhook_sub(receiver, exp)
    receiver.statuses = [500, 503]
    fail(wu)
    outbox.pump()
    d = Delivery.objects.get()
    assert d.status == DeliveryStatus.PENDING and d.attempts == 1 and d.next_attempt_time > timezone.now()
    first_wait = d.next_attempt_time
    services.deliver(d.id, now=d.next_attempt_time + timedelta(seconds=1))
    d.refresh_from_db()
    assert d.attempts == 2 and d.last_status_code == 503
    services.deliver(d.id, now=d.next_attempt_time + timedelta(seconds=1))
    d.refresh_from_db()
    assert d.status == DeliveryStatus.DELIVERED
    assert {r.headers["webhook-id"] for r in receiver.requests} == {d.message_id}
    assert len({r.body for r in receiver.requests}) == 1
    assert all(r.verified for r in receiver.requests)
    assert [a.status_code for a in DeliveryAttempt.objects.order_by("id")] == [500, 503, 200]
    assert first_wait > d.create_time


def test_it_gets_the_event_to_a_receiver_down_for_a_while_after_it_comes_back(receiver, outbox) -> None:
    exp = launched()
    wu = factories.work_unit(exp)
    webhook_sub(receiver, exp)
    port = receiver.port
    receiver.stop()
    fail(wu)
    outbox.pump()
    d = Delivery.objects.get()
    assert d.status == DeliveryStatus.PENDING and "Connection" in d.last_error
    services.deliver(d.id, now=d.next_attempt_time + timedelta(seconds=1))
    assert Delivery.objects.get().attempts == 2
    receiver.port = port
    receiver.start()
    d.refresh_from_db()
    services.deliver(d.id, now=d.next_attempt_time + timedelta(seconds=1))
    d.refresh_from_db()
    assert d.status == DeliveryStatus.DELIVERED and d.attempts == 3
    assert len(receiver.requests) == 1 and receiver.requests[0].verified


def _dead_delivery(receiver: Any, outbox: Any, settings: Any, *, attempts: int, status: int) -> Delivery:
    """A failed work unit's webhook message whose receiver answers ``status`` until it is DEAD."""
    settings.XMC_NOTIFY_MAX_ATTEMPTS = attempts
    settings.XMC_NOTIFY_BREAKER_FAILURES = 100
    exp = launched()
    webhook_sub(receiver, exp)
    receiver.statuses = [status] * 10
    fail(factories.work_unit(exp))
    outbox.pump()
    d = Delivery.objects.get()
    for _ in range(attempts + 2):
        services.deliver(d.id, now=timezone.now() + LATER)
    d.refresh_from_db()
    return d


def test_it_makes_a_dead_letter_of_the_last_failed_try(receiver, outbox, settings) -> None:
    d = _dead_delivery(receiver, outbox, settings, attempts=3, status=500)
    assert d.status == DeliveryStatus.DEAD and d.attempts == 3
    assert len(receiver.requests) == 3
    # "send again" (admin) puts it back with the same webhook-id
    receiver.statuses = []
    services.send_again(d.id)
    outbox.pump()
    d.refresh_from_db()
    assert d.status == DeliveryStatus.DELIVERED
    assert {r.headers["webhook-id"] for r in receiver.requests} == {d.message_id}


def test_it_lists_a_dead_delivery_with_the_dead_letters_and_delivers_it_when_sent_again_there(
        receiver, outbox, settings, django_capture_on_commit_callbacks) -> None:
    """Every exhausted retry is one kind of record (the actuator's, the outbox's, a notification's):
    the operators' list shows the dead delivery, and its "send again" goes through the notifications'
    own handler (the same webhook-id); a subscriber's "Send again" closes the letter too."""
    from django.test import Client

    from workunits.models import DeadLetter

    d = _dead_delivery(receiver, outbox, settings, attempts=2, status=503)
    assert d.status == DeliveryStatus.DEAD
    letter = DeadLetter.objects.get()
    assert (letter.source, letter.source_id, letter.error_code, letter.attempts) == (
        "notifications.delivery", d.id, "HTTP_503", 2)
    assert letter.requeued_time is None and d.message_id in bytes(letter.payload).decode()

    operator = Client()
    operator.force_login(new_user("olivia", is_superuser=True))
    listed = operator.get("/admin/workunits/deadletter/").content.decode()
    assert f"notifications.delivery {d.id}" in listed
    receiver.statuses = []
    with django_capture_on_commit_callbacks(execute=True):
        back = operator.post(f"/admin/workunits/deadletter/{letter.id}/requeue/", follow=True)
    assert f"Re-queued dead letter {letter.id}." in back.content.decode()
    outbox.pump()
    d.refresh_from_db()
    letter.refresh_from_db()
    assert d.status == DeliveryStatus.DELIVERED and letter.requeued_time is not None
    assert {r.headers["webhook-id"] for r in receiver.requests} == {d.message_id}  # a retry, not a new event

    # It dies again; this time the subscriber sends it again from their delivery log.
    receiver.statuses = [503] * 10
    services.send_again(d.id)
    for _ in range(3):
        services.deliver(d.id, now=timezone.now() + LATER)
    second = DeadLetter.objects.filter(requeued_time__isnull=True).get()
    receiver.statuses = []
    services.resend(Identity(factories.ALICE), d.subscription_id, d.message_id)
    second.refresh_from_db()
    assert second.requeued_time is not None

def test_it_opens_the_circuit_of_a_subscription_that_keeps_failing(receiver, outbox, settings) -> None:
    settings.XMC_NOTIFY_BREAKER_FAILURES = 2
    settings.XMC_NOTIFY_BREAKER_OPEN_S = 3600
    receiver.statuses = [500] * 10
    exps = [launched() for _ in range(3)]
    _, receiver.secret = subscribe(allMyExperiments=True, webhook={"url": receiver.url})
    for exp in exps:
        fail(factories.work_unit(exp))
    outbox.pump()
    assert len(receiver.requests) == 2  # the third waits behind the open circuit
    waiting = Delivery.objects.get(attempts=0)
    assert waiting.last_error.startswith("circuit open") and waiting.status == DeliveryStatus.PENDING


def test_it_sends_nothing_to_a_subscriber_who_cannot_read_the_experiment(receiver, outbox) -> None:
    exp = launched()
    Experiment.objects.filter(id=exp.id).update(acls={"readers": [{"user": BOB}]})
    wu = factories.work_unit(exp)
    webhook_sub(receiver, exp, owner=BOB)  # allowed: Bob reads it now
    # Bob also subscribes to "every experiment matching a filter": Alice's other one he cannot read
    secret_exp = launched()
    subscribe(BOB, filter=f'title = "{secret_exp.title}"', webhook={"url": receiver.url})
    Experiment.objects.filter(id=exp.id).update(acls={})  # Bob loses access before the failure
    fail(wu, factories.work_unit(secret_exp))
    outbox.pump()
    assert receiver.requests == []
    assert not Delivery.objects.filter(status=DeliveryStatus.DELIVERED).exists()


def test_it_checks_access_again_at_send_time(receiver, outbox, settings) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 60
    exp = launched()
    Experiment.objects.filter(id=exp.id).update(acls={"readers": [{"user": BOB}]})
    webhook_sub(receiver, exp, owner=BOB)
    fail(factories.work_unit(exp))
    outbox.pump()
    d = Delivery.objects.get()
    Experiment.objects.filter(id=exp.id).update(acls={})
    services.deliver(d.id, now=timezone.now() + LATER)
    d.refresh_from_db()
    assert d.status == DeliveryStatus.SUPPRESSED and BOB in d.last_error
    assert receiver.requests == []


def test_it_refuses_an_ssrf_target_at_send_time_too(receiver, outbox, settings) -> None:
    exp = launched()
    webhook_sub(receiver, exp)
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = []  # e.g. the DNS name now resolves to loopback
    fail(factories.work_unit(exp))
    outbox.pump()
    d = Delivery.objects.get()
    assert d.status == DeliveryStatus.DEAD and "url" in d.last_error and "loopback" in d.last_error
    assert receiver.requests == []


def test_it_gives_one_coalesced_message_for_a_500_unit_sweep_that_fails(receiver, smtp, outbox, settings) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 60
    exp = launched(title="sweep")
    units = [factories.work_unit(exp) for _ in range(500)]
    webhook_sub(receiver, exp)
    subscribe(experiment=f"experiments/{exp.id}", email={})
    for i in range(0, 500, 100):  # five reconciler flushes
        fail(*units[i:i + 100])
        outbox.pump()
    assert receiver.requests == [] and smtp.messages == []  # the window is still open
    for d in Delivery.objects.all():
        services.deliver(d.id, now=timezone.now() + timedelta(seconds=61))
    assert len(receiver.requests) == 1 and len(smtp.messages) == 1
    data = receiver.requests[0].json["data"]
    assert data["count"] == 500 and len(data["workUnits"]) == 10 and data["truncated"] is True
    assert "500 work units failed in sweep" in smtp.messages[0]["Subject"]
    assert "... and 490 more" in smtp.messages[0].get_payload()


def test_it_says_how_its_work_units_ended_when_the_experiment_finishes(receiver, outbox) -> None:
    exp = launched()
    ok, bad = factories.work_unit(exp), factories.work_unit(exp)
    webhook_sub(receiver, exp, events=["EXPERIMENT_FINISHED"])
    set_state([ok], WorkUnitState.COMPLETED)
    outbox.pump()
    assert receiver.requests == []  # still ACTIVE: one unit runs
    fail(bad)
    outbox.pump()
    assert len(receiver.requests) == 1
    body = receiver.requests[0].json
    assert body["type"] == "experiment.finished"
    assert body["data"]["stateCounts"] == {"COMPLETED": 1, "FAILED": 1}


def test_it_gives_slack_blocks_with_title_counts_and_a_link(receiver, outbox, settings) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 30
    exp = launched(title="resnet")
    subscribe(experiment=f"experiments/{exp.id}", slack={"url": receiver.url})
    fail(factories.work_unit(exp), factories.work_unit(exp))
    outbox.pump()
    assert receiver.requests == []
    services.deliver(Delivery.objects.get().id, now=timezone.now() + timedelta(seconds=31))
    assert len(receiver.requests) == 1
    message = receiver.requests[0].json
    assert "webhook-signature" not in receiver.requests[0].headers
    assert message["blocks"][0] == {"type": "header", "text": {"type": "plain_text",
                                                               "text": "2 work units failed in resnet"}}
    assert {"type": "mrkdwn", "text": "*Count*\n2"} in message["blocks"][1]["fields"]
    assert message["blocks"][-1]["elements"][0]["url"] == f"http://127.0.0.1:8000/experiments/{exp.id}"


def test_it_holds_messages_in_quiet_hours_until_they_end(receiver, outbox) -> None:
    exp = launched()
    sid = webhook_sub(receiver, exp)
    now = timezone.now()
    start, end = (now - timedelta(hours=1)).time(), (now + timedelta(hours=1)).time()
    services.update(Identity(ALICE), sid, {"quietHours": {"start": start.strftime("%H:%M"),
                                                          "end": end.strftime("%H:%M")}})
    fail(factories.work_unit(exp))
    outbox.pump()
    d = Delivery.objects.get()
    assert receiver.requests == [] and d.last_error == "quiet hours" and d.next_attempt_time > now
    fail(factories.work_unit(exp))  # joins the held message
    outbox.pump()
    assert Delivery.objects.count() == 1
    services.deliver(d.id, now=d.next_attempt_time + timedelta(minutes=1))
    assert len(receiver.requests) == 1 and receiver.requests[0].json["data"]["count"] == 2


def test_it_makes_a_subscriber_over_the_rate_limit_wait(receiver, outbox) -> None:
    exps = [launched() for _ in range(3)]
    sid, secret = subscribe(allMyExperiments=True, webhook={"url": receiver.url}, rateLimitPerHour=2)
    receiver.secret = secret
    for exp in exps:
        fail(factories.work_unit(exp))
        outbox.pump()
    assert len(receiver.requests) == 2
    held = Delivery.objects.get(status=DeliveryStatus.PENDING)
    assert held.last_error.startswith("rate limit")
    services.deliver(held.id, now=timezone.now() + timedelta(hours=1, minutes=1))
    assert len(receiver.requests) == 3


def test_it_delivers_a_test_event_and_the_staff_scheduling_events(receiver, smtp, outbox) -> None:

    from workunits import scheduling

    new_user("olivia", is_staff=True)
    staff = Identity("olivia@example.com", is_staff=True)
    created = services.create(staff, {"events": ["SCHEDULING_PAUSED", "SCHEDULING_RESUMED"],
                                      "webhook": {"url": receiver.url}})
    receiver.secret = created.secret
    services.send_test(staff, created.subscription.id)
    outbox.pump()
    assert receiver.requests[-1].json["type"] == "test" and receiver.requests[-1].verified
    hooks.on_scheduling_changed(41, True, "olivia@example.com", "upgrade")
    hooks.on_scheduling_changed(42, False, "olivia@example.com", "")
    outbox.pump()
    assert [r.json["type"] for r in receiver.requests[1:]] == ["scheduling.paused", "scheduling.resumed"]
    assert receiver.requests[1].json["data"]["reason"] == "upgrade"
    assert scheduling is not None


def test_it_still_verifies_with_the_previous_secret_during_the_rotation_overlap(receiver, outbox) -> None:
    exp = launched()
    sid = webhook_sub(receiver, exp)
    old = receiver.secret
    services.rotate_secret(Identity(ALICE), sid)
    receiver.secret = old  # a receiver that has not picked up the new secret yet
    fail(factories.work_unit(exp))
    outbox.pump()
    assert receiver.requests[0].verified
    assert len(receiver.requests[0].headers["webhook-signature"].split(" ")) == 2


def test_it_lets_staff_subscribe_a_group_whose_members_get_the_email(smtp, outbox) -> None:
    from django.contrib.auth.models import Group

    team = Group.objects.create(name="ml-team")
    for name in ("ann", "ben"):
        new_user(name).groups.add(team)
    new_user("olivia", is_staff=True)
    staff = Identity("olivia@example.com", is_staff=True)
    exp = launched()
    with pytest.raises(Exception) as denied:
        services.create(Identity(ALICE), {"group": "ml-team", "experiment": f"experiments/{exp.id}",
                                          "events": ["WORK_UNIT_FAILED"], "email": {}})
    assert getattr(denied.value, "field", None) == "group"
    # staff may subscribe the group, but the group itself must be able to read the experiment
    services.create(staff, {"group": "ml-team", "experiment": f"experiments/{exp.id}", "events": ["WORK_UNIT_FAILED"],
                            "email": {}})
    fail(factories.work_unit(exp))
    outbox.pump()
    assert smtp.messages == []
    assert Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 0
    Experiment.objects.filter(id=exp.id).update(acls={"readers": [{"group": "ml-team"}]})
    fail(factories.work_unit(exp))
    outbox.pump()
    assert len(smtp.messages) == 1
    assert smtp.messages[0]["To"] == "ann@example.com"  # ben in Bcc: the envelope has both
    assert smtp.recipients == [["ann@example.com", "ben@example.com"]]


def test_it_sends_one_email_per_failure_to_a_member_subscribed_on_their_own_and_through_their_group(smtp, outbox) -> None:
    from django.contrib.auth.models import Group

    from xmc.auth.identity import identity_for_email

    team = Group.objects.create(name="ml-team")
    for name in ("ann", "ben"):
        new_user(name).groups.add(team)
    new_user("olivia", is_staff=True)
    exp = launched()
    Experiment.objects.filter(id=exp.id).update(acls={"readers": [{"group": "ml-team"}]})
    # Ann subscribes first on her own, then staff subscribe her whole group.
    services.create(identity_for_email("ann@example.com"), {"experiment": f"experiments/{exp.id}",
                                                            "events": ["WORK_UNIT_FAILED"], "email": {}})
    services.create(Identity("olivia@example.com", is_staff=True),
                    {"group": "ml-team", "experiment": f"experiments/{exp.id}", "events": ["WORK_UNIT_FAILED"],
                     "email": {}})
    fail(factories.work_unit(exp))
    outbox.pump()
    assert Delivery.objects.count() == 1
    assert smtp.recipients == [["ann@example.com", "ben@example.com"]]  # Ann once, through her group
