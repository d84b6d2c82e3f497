"""Issue 40, item 2, as the attack: one subscriber's failing receiver (or an experiment title
built to break an e-mail) must not delay anybody else's messages. Circuit breakers count per
subscription; e-mail headers are built safely from any title."""
from __future__ import annotations

from datetime import timedelta
from email.header import decode_header, make_header
from typing import Any

import pytest
from django.utils import timezone

from experiments.models import Experiment
from notifications import services
from notifications.models import Delivery, DeliveryStatus
from tests import factories
from tests.notifications.helpers import fail
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db
ALICE, BOB = factories.ALICE, factories.BOB


def launched(creator: str, **kw: Any) -> Experiment:
    exp = factories.experiment(creator=creator, **kw)
    Experiment.objects.filter(id=exp.id).update(launch_state="COMPLETED")
    return exp


def subscribe(owner: str, channel: dict[str, Any]) -> int:
    return services.create(Identity(owner), {"allMyExperiments": True, "events": ["WORK_UNIT_FAILED"],
                                             **channel}).subscription.id


@pytest.mark.parametrize("kind", ["webhook", "slack"])
def test_it_keeps_delivering_to_alice_while_bobs_receiver_on_the_same_host_fails(
        kind: str, receiver, outbox, settings) -> None:
    settings.XMC_NOTIFY_BREAKER_FAILURES = 2
    settings.XMC_NOTIFY_BREAKER_OPEN_S = 3600
    base = receiver.url.rsplit("/", 1)[0]
    receiver.failing_paths = {"/bob"}
    bob_sub = subscribe(BOB, {kind: {"url": f"{base}/bob"}})
    alice_sub = subscribe(ALICE, {kind: {"url": f"{base}/alice"}})
    for _ in range(3):  # Bob's receiver fails twice: his circuit opens, his third message waits
        fail(factories.work_unit(launched(BOB)))
        outbox.pump()
    assert Delivery.objects.filter(subscription_id=bob_sub, last_error__startswith="circuit open").count() == 1
    fail(factories.work_unit(launched(ALICE)))
    outbox.pump()
    alice = Delivery.objects.get(subscription_id=alice_sub)
    assert alice.status == DeliveryStatus.DELIVERED, alice.last_error
    assert "circuit open" not in alice.last_error


def test_it_keeps_emailing_alice_while_bobs_mailbox_refuses_everything(smtp, outbox, settings) -> None:
    settings.XMC_NOTIFY_BREAKER_FAILURES = 2
    settings.XMC_NOTIFY_BREAKER_OPEN_S = 3600
    smtp.refuse.add(BOB)
    bob_sub, alice_sub = subscribe(BOB, {"email": {}}), subscribe(ALICE, {"email": {}})
    for _ in range(3):
        fail(factories.work_unit(launched(BOB)))
        outbox.pump()
    assert Delivery.objects.filter(subscription_id=bob_sub, last_error__startswith="circuit open").count() == 1
    fail(factories.work_unit(launched(ALICE)))
    outbox.pump()
    assert Delivery.objects.get(subscription_id=alice_sub).status == DeliveryStatus.DELIVERED
    assert [r for r in smtp.recipients] == [[ALICE]]


@pytest.mark.parametrize("title", [
    "resnet\r\nBcc: mallory@example.com",
    "resnet\nX-Injected: yes\n\nbody takeover",
    "resnet\u2028Bcc: mallory@example.com",
    "resnet\x0b\x1b[2Jsweep\x85Bcc: mallory@example.com",
    "x" * 1000,
])
def test_it_emails_about_an_experiment_whatever_its_title_without_adding_a_header(
        title: str, smtp, outbox) -> None:
    sid = subscribe(ALICE, {"email": {}})
    fail(factories.work_unit(launched(ALICE, title=title)))
    outbox.pump()
    d = Delivery.objects.get(subscription_id=sid)
    assert d.status == DeliveryStatus.DELIVERED, d.last_error
    [message] = smtp.messages
    assert smtp.recipients == [[ALICE]]  # no Bcc slipped in
    assert message["Bcc"] is None and message["X-Injected"] is None
    subject = str(make_header(decode_header(message["Subject"])))
    assert subject.startswith(("[XMC] 1 work unit failed in resnet ", "[XMC] 1 work unit failed in xxx")), subject
    assert not any(c in subject for c in "\r\n\x0b\x1b\x85\u2028") and len(subject) <= 200


def test_it_does_not_open_alices_circuit_when_her_other_subscription_fails(receiver, smtp, outbox, settings) -> None:
    """Per subscription, not per owner: Alice's broken webhook leaves her e-mail alone."""
    settings.XMC_NOTIFY_BREAKER_FAILURES = 1
    settings.XMC_NOTIFY_BREAKER_OPEN_S = 3600
    receiver.failing_paths = {"/hook"}
    subscribe(ALICE, {"webhook": {"url": receiver.url}})
    mail_sub = subscribe(ALICE, {"email": {}})
    fail(factories.work_unit(launched(ALICE)))
    outbox.pump(now=timezone.now() + timedelta(seconds=1))
    assert Delivery.objects.get(subscription_id=mail_sub).status == DeliveryStatus.DELIVERED
