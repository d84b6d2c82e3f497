"""The subscription pages through Django's test client: create, change, delete, the secret shown
once, the services' errors next to their field (and nothing written), strangers, CSRF, "Notify me".

Real Postgres, the real notification services; a webhook's test event goes to a real
loopback receiver that verifies the signature with the Standard Webhooks library.
"""
from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from notifications import channels
from notifications.models import Channel, Delivery, DeliveryStatus, Scope, Subscription
from tests import factories
from tests.notifications.conftest import Outbox, Receiver, outbox, receiver  # noqa: F401 - fixtures
from tests.ui import pages

pytestmark = pytest.mark.django_db

ALICE, BOB = "alice@example.com", "bob@example.com"
SECRET = re.compile(r"whsec_[A-Za-z0-9+/=]+")


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]


def _as(name: str, **kw: Any) -> Client:
    pages.person(name)
    client = Client(**kw)
    assert client.login(username=name, password=pages.PASSWORD)
    return client


def _create(client: Client, **fields: Any) -> Any:
    form = {"what": "experiment", "events": ["WORK_UNIT_FAILED", "EXPERIMENT_FINISHED"], "channel": "email",
            **fields}
    return client.post("/subscriptions", form)


def _webhook_to(client: Client, receiver: Receiver) -> Subscription:
    """A webhook subscription made on the form; the receiver verifies with the secret the answer showed."""
    created = _create(client, what="mine", channel="webhook", url=receiver.url)
    (receiver.secret,) = SECRET.findall(created.content.decode())
    return Subscription.objects.get(url=receiver.url)


def _state() -> list[tuple[Any, ...]]:
    return list(Subscription.objects.order_by("id").values_list(
        "id", "owner", "scope", "experiment_id", "filter", "events", "channel", "url", "email", "enabled",
        "rate_limit_per_hour", "quiet_start", "quiet_end", "secret_encrypted"))


def test_it_lists_only_my_subscriptions_with_what_when_where_and_the_last_delivery(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=ALICE, title="resnet")
    assert _create(alice_signed_in, experiment=str(exp.id)).status_code == 200
    assert _create(alice_signed_in, what="mine", events=["WORK_UNIT_FAILED"]).status_code == 200
    bob = _as("bob")
    _create(bob, what="filter", filter='tags:"bobs"')
    mine = Subscription.objects.filter(owner=ALICE).order_by("id")
    Delivery.objects.create(subscription=mine[0], type="TEST", status=DeliveryStatus.DEAD,
                            not_before=exp.create_time, next_attempt_time=exp.create_time,
                            create_time=exp.create_time)
    body = alice_signed_in.get("/subscriptions").content.decode()
    assert f'id="sub-{mine[0].id}"' in body and f'id="sub-{mine[1].id}"' in body
    assert f"experiment {exp.id}" in body and "all my experiments" in body and "bobs" not in body
    row = body.split(f'id="sub-{mine[0].id}"')[1].split("</tr>")[0]
    assert "the experiment finished, a work unit failed" in row and ALICE in row and "d-DEAD" in row
    assert "none yet" in body.split(f'id="sub-{mine[1].id}"')[1].split("</tr>")[0]
    assert 'href="/subscriptions"' in body  # the nav link of the base template
    assert "script-src 'self'" in alice_signed_in.get("/subscriptions")["Content-Security-Policy"]


def test_it_creates_each_kind_from_the_form(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=ALICE)
    _create(alice_signed_in, experiment=str(exp.id), rate="5", quiet_start="22:00", quiet_end="07:00")
    _create(alice_signed_in, what="filter", filter='tags:"nlp"', channel="slack", url="http://127.0.0.1:9/slack")
    _create(alice_signed_in, what="mine", channel="webhook", url="http://127.0.0.1:9/hook",
            events=["WORK_UNIT_QUEUED_TOO_LONG"], queued="15")
    email, slack, hook = Subscription.objects.order_by("id")
    assert (email.scope, email.experiment_id, email.channel, email.email) == (Scope.EXPERIMENT, exp.id,
                                                                             Channel.EMAIL, ALICE)
    assert email.rate_limit_per_hour == 5 and f"{email.quiet_start:%H:%M}-{email.quiet_end:%H:%M}" == "22:00-07:00"
    assert (slack.scope, slack.filter, slack.channel, channels.slack_url(slack)) == (
        Scope.FILTER, 'tags:"nlp"', Channel.SLACK, "http://127.0.0.1:9/slack")
    assert (hook.scope, hook.channel, hook.queued_minutes, hook.events) == (Scope.MINE, Channel.WEBHOOK, 15,
                                                                            ["WORK_UNIT_QUEUED_TOO_LONG"])


def test_it_shows_a_webhooks_secret_once_after_creation_and_once_after_rotation(alice_signed_in: Client) -> None:
    created = _create(alice_signed_in, what="mine", channel="webhook", url="http://127.0.0.1:9/hook")
    assert created.status_code == 200 and created["Cache-Control"] == "no-store"
    (secret,) = SECRET.findall(created.content.decode())
    sub = Subscription.objects.get()
    for url in ("/subscriptions", f"/subscriptions/{sub.id}"):
        assert "whsec_" not in alice_signed_in.get(url).content.decode()
    ask = alice_signed_in.post(f"/subscriptions/{sub.id}/actions", {"action": "rotate"})
    assert "whsec_" not in ask.content.decode() and 'value="yes"' in ask.content.decode()
    assert Subscription.objects.get().secret_encrypted == sub.secret_encrypted  # nothing rotated yet
    rotated = alice_signed_in.post(f"/subscriptions/{sub.id}/actions", {"action": "rotate", "confirm": "yes"})
    (new,) = SECRET.findall(rotated.content.decode())
    assert new != secret and rotated["Cache-Control"] == "no-store"
    expires = Subscription.objects.get().previous_secret_expires
    assert expires is not None  # the page says how long the previous secret still signs
    assert f"keeps signing beside the new one until {expires:%Y-%m-%d %H:%M} UTC (24 h" in rotated.content.decode()
    assert "whsec_" not in alice_signed_in.get(f"/subscriptions/{sub.id}").content.decode()
    email = _create(alice_signed_in, what="mine")
    assert "whsec_" not in email.content.decode() and 'id="created"' in email.content.decode()


@pytest.mark.parametrize("fields, field, words", [
    ({"events": []}, "events", "events must be a non-empty list"),
    ({"experiment": "x1"}, "experiment", "experiment must be a name"),
    ({"what": "filter", "filter": "title =="}, "filter", "filter:"),
    ({"channel": "webhook", "url": "ftp://example.com/x"}, "url", "http"),
    ({"channel": "webhook", "url": "http://10.0.0.7/hook"}, "url", "private"),
    ({"rate": "lots"}, "rate", "rateLimitPerHour must be an integer"),
    ({"rate": "0"}, "rate", "rateLimitPerHour must be an integer"),
    ({"quiet_start": "22:00"}, "quiet", "quietHours"),
    ({"quiet_start": "25:99", "quiet_end": "07:00"}, "quiet", "quietHours.start"),
    ({"events": ["SCHEDULING_PAUSED"], "what": "mine"}, "events", "only staff"),
])
def test_it_shows_an_error_of_the_services_next_to_its_field_and_changes_nothing(
        alice_signed_in: Client, fields: dict[str, Any], field: str, words: str) -> None:
    exp = factories.experiment(creator=ALICE)
    fields = {"experiment": str(exp.id), **fields}
    before = _state()
    response = _create(alice_signed_in, **fields)
    body = response.content.decode()
    assert response.status_code == 400 and _state() == before
    message = body.split(f'id="{field}-error">')[1].split("<")[0]
    assert words.lower() in message.lower(), message
    # The form comes back as it was typed.
    for name in ("filter", "url", "rate", "experiment"):
        if name in fields:
            assert f'name="{name}" value="{fields[name]}"' in body.replace("&quot;", '"')


def test_it_refuses_someone_elses_or_an_unreadable_experiment_on_the_experiment_field(alice_signed_in: Client) -> None:
    hidden = factories.experiment(creator=BOB, title="bobs")
    response = _create(alice_signed_in, experiment=str(hidden.id))
    assert response.status_code == 400 and "may not read" in response.content.decode().split(
        'id="experiment-error">')[1] and Subscription.objects.count() == 0


def test_it_disables_enables_changes_and_deletes_after_a_confirmation(alice_signed_in: Client) -> None:
    _create(alice_signed_in, what="mine", channel="webhook", url="http://127.0.0.1:9/hook")
    sub = Subscription.objects.get()
    act = f"/subscriptions/{sub.id}/actions"
    assert alice_signed_in.post(act, {"action": "disable"})["Location"] == f"/subscriptions/{sub.id}"
    assert Subscription.objects.get().enabled is False
    assert 'value="enable"' in alice_signed_in.get(f"/subscriptions/{sub.id}").content.decode()
    alice_signed_in.post(act, {"action": "enable"})
    assert Subscription.objects.get().enabled is True
    changed = alice_signed_in.post(act, {"action": "update", "events": ["EXPERIMENT_FINISHED"], "url": "http://127.0.0.1:9/v2",
                               "rate": "7", "queued": "30", "quiet_start": "23:00", "quiet_end": "06:30"})
    assert changed.status_code == 302
    sub = Subscription.objects.get()
    assert (sub.events, sub.url, sub.rate_limit_per_hour, f"{sub.quiet_start:%H:%M}") == (
        ["EXPERIMENT_FINISHED"], "http://127.0.0.1:9/v2", 7, "23:00")
    before = _state()
    bad = alice_signed_in.post(act, {"action": "update", "events": ["EXPERIMENT_FINISHED"], "url": "javascript:alert(1)",
                           "rate": "7"})
    assert bad.status_code == 400 and _state() == before
    assert 'id="url-error"' in bad.content.decode() and 'value="javascript:alert(1)"' in bad.content.decode()
    ask = alice_signed_in.post(act, {"action": "delete"})
    assert ask.status_code == 200 and "Delete subscription" in ask.content.decode()
    assert Subscription.objects.count() == 1
    assert alice_signed_in.post(act, {"action": "delete", "confirm": "yes"})["Location"] == "/subscriptions"
    assert Subscription.objects.count() == 0
    assert alice_signed_in.get(f"/subscriptions/{sub.id}").status_code == 404


def test_it_sends_a_test_event_to_the_receiver_and_shows_it_in_the_delivery_log(
        alice_signed_in: Client, receiver: Receiver, outbox: Outbox, settings: Any) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 0.0
    sub = _webhook_to(alice_signed_in, receiver)
    sent = alice_signed_in.post(f"/subscriptions/{sub.id}/actions", {"action": "test"})
    assert sent["Location"] == f"/subscriptions/{sub.id}?sent=1"
    # On its way: the log re-reads itself (htmx, every second) until the message is out.
    assert 'hx-trigger="every 1s"' in alice_signed_in.get(f"/subscriptions/{sub.id}?sent=1").content.decode()
    outbox.pump()
    fragment = alice_signed_in.get(f"/subscriptions/{sub.id}?fragment=log").content.decode()
    assert "<html" not in fragment and 'id="log"' in fragment
    assert "hx-trigger" not in fragment and "d-DELIVERED" in fragment
    assert len(receiver.requests) == 1 and receiver.requests[0].verified
    delivery = Delivery.objects.get()
    body = alice_signed_in.get(f"/subscriptions/{sub.id}?sent=1").content.decode()
    row = body.split(f'id="d-{delivery.message_id}"')[1].split("</tr>")[0]
    assert receiver.requests[0].headers["webhook-id"] == delivery.message_id
    assert "d-DELIVERED" in row and ">200<" in row and "1 try" in row
    assert 'id="sent"' in body
    assert "d-DELIVERED" in alice_signed_in.get("/subscriptions").content.decode()


def test_it_answers_404_to_reading_or_acting_on_a_strangers_subscription(alice_signed_in: Client) -> None:
    _create(alice_signed_in, what="mine", channel="webhook", url="http://127.0.0.1:9/hook")
    sub = Subscription.objects.get()
    bob = _as("bob")
    before = _state()
    assert bob.get(f"/subscriptions/{sub.id}").status_code == 404
    for action in ("disable", "test", "delete", "rotate"):
        response = bob.post(f"/subscriptions/{sub.id}/actions", {"action": action, "confirm": "yes"})
        assert response.status_code == 404 and "whsec_" not in response.content.decode()
    assert _state() == before and Delivery.objects.count() == 0
    assert bob.get("/subscriptions/999999").status_code == 404
    assert Client().get("/subscriptions")["Location"] == "/login?next=%2Fsubscriptions"


def test_it_needs_the_csrf_token_on_every_post() -> None:
    strict = _as("alice", enforce_csrf_checks=True)
    exp = factories.experiment(creator=ALICE)
    assert _create(strict, experiment=str(exp.id)).status_code == 403
    assert strict.post(f"/experiments/{exp.id}/notify").status_code == 403
    assert Subscription.objects.count() == 0
    page = strict.get("/subscriptions").content.decode()
    token = page.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    assert _create(strict, experiment=str(exp.id), csrfmiddlewaretoken=token).status_code == 200
    sub = Subscription.objects.get()
    assert strict.post(f"/subscriptions/{sub.id}/actions", {"action": "disable"}).status_code == 403
    assert Subscription.objects.get().enabled is True


def test_it_subscribes_by_email_to_the_experiment_from_notify_me_on_its_page(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=BOB, title="shared", acls=pages.shared_with(ALICE))
    page = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert f'action="/experiments/{exp.id}/notify"' in page and "Notify me" in page
    response = alice_signed_in.post(f"/experiments/{exp.id}/notify")
    sub = Subscription.objects.get()
    assert response["Location"] == f"/subscriptions/{sub.id}"
    assert (sub.owner, sub.scope, sub.experiment_id, sub.channel, sub.email, sorted(sub.events)) == (
        ALICE, Scope.EXPERIMENT, exp.id, Channel.EMAIL, ALICE, ["EXPERIMENT_FINISHED", "WORK_UNIT_FAILED"])
    # Subscribed: the page links to it instead of offering a second one (the live header too).
    for url in (f"/experiments/{exp.id}", f"/experiments/{exp.id}?fragment=summary"):
        again = alice_signed_in.get(url).content.decode()
        assert f'href="/subscriptions/{sub.id}"' in again and "/notify" not in again


def test_it_answers_404_to_notify_me_on_an_experiment_i_may_not_read_and_writes_nothing(alice_signed_in: Client) -> None:
    hidden = factories.experiment(creator=BOB, title="bobs")
    assert alice_signed_in.post(f"/experiments/{hidden.id}/notify").status_code == 404
    assert alice_signed_in.post("/experiments/999999/notify").status_code == 404
    assert Subscription.objects.count() == 0


def test_it_prints_what_people_type_as_text(alice_signed_in: Client) -> None:
    _create(alice_signed_in, what="filter", filter=f'title = "{pages.HOSTILE}"', channel="webhook",
            url="http://127.0.0.1:9/x?q=<script>")
    body = alice_signed_in.get("/subscriptions").content.decode()
    assert "<script>alert" not in body and "&lt;script&gt;alert(1)" in body


def test_it_puts_a_logged_message_back_with_the_same_webhook_id_on_send_again_for_its_owner_only(
        alice_signed_in: Client, receiver: Receiver, outbox: Outbox, settings: Any) -> None:
    settings.XMC_NOTIFY_COALESCE_S = 0.0
    sub = _webhook_to(alice_signed_in, receiver)
    receiver.statuses = [500] * 50  # every try fails: the message ends as a dead letter
    alice_signed_in.post(f"/subscriptions/{sub.id}/actions", {"action": "test"})
    settings.XMC_NOTIFY_MAX_ATTEMPTS = 1
    outbox.pump()
    dead = Delivery.objects.get()
    assert dead.status == DeliveryStatus.DEAD
    page = alice_signed_in.get(f"/subscriptions/{sub.id}").content.decode()
    assert f'name="message" value="{dead.message_id}"' in page and "Send again" in page
    bob = _as("bob")
    again = {"action": "resend", "message": dead.message_id}
    assert bob.post(f"/subscriptions/{sub.id}/actions", again).status_code == 404
    missing = alice_signed_in.post(f"/subscriptions/{sub.id}/actions", {"action": "resend", "message": "msg_nope"})
    assert missing.status_code == 404 and "has no message msg_nope" in missing.content.decode()
    assert Delivery.objects.get().status == DeliveryStatus.DEAD
    receiver.statuses = []
    assert alice_signed_in.post(f"/subscriptions/{sub.id}/actions", again).status_code == 302
    on_its_way = alice_signed_in.post(f"/subscriptions/{sub.id}/actions", again)
    assert on_its_way.status_code == 400 and "still on its way" in on_its_way.content.decode()
    outbox.pump()
    assert Delivery.objects.get().status == DeliveryStatus.DELIVERED
    ids = {r.headers["webhook-id"] for r in receiver.requests}
    assert ids == {dead.message_id} and receiver.requests[-1].verified
