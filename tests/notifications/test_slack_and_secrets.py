"""Issue 40, informational findings, as the attack: an experiment title that mentions the whole
Slack channel or disguises a link; a Slack webhook URL (which lets anyone post to the channel)
read from the database; a rotated webhook secret that keeps signing without saying so."""
from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from experiments.models import Experiment
from notifications import channels, crypto, services
from notifications.models import Subscription
from tests import factories
from tests.notifications.helpers import fail
from xmc.auth.identity import Identity
from xmc.auth.tokens import issue_token

ALICE = factories.ALICE
HOSTILE = "<!channel> urgent: <http://evil.example/login|open the dashboard> & <@U0123> > done"
SLACK_PATH = "/services/T000/B000/XXXXsecretXXXX"


def api(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    r = Client().generic(method, url, json.dumps(body) if body is not None else "", content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {issue_token(ALICE)}")
    return r.status_code, json.loads(r.content)


def mrkdwn_texts(message: dict[str, Any]) -> list[str]:
    """The texts Slack parses for mentions and links: the fallback and every mrkdwn object."""
    found = [message["text"]]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "mrkdwn":
                found.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(message["blocks"])
    return found


@pytest.mark.django_db
def test_it_posts_a_hostile_title_to_slack_as_text_not_as_a_mention_or_a_link(receiver, outbox) -> None:
    exp = factories.experiment(title=HOSTILE)
    Experiment.objects.filter(id=exp.id).update(launch_state="COMPLETED")
    services.create(Identity(ALICE), {"experiment": f"experiments/{exp.id}", "events": ["WORK_UNIT_FAILED"],
                                      "slack": {"url": receiver.url.replace("/hook", SLACK_PATH)}})
    fail(factories.work_unit(exp))
    outbox.pump()
    [request] = receiver.requests
    texts = mrkdwn_texts(request.json)
    assert any("&lt;!channel&gt; urgent: &lt;http://evil.example/login|open the dashboard&gt; &amp; "
               "&lt;@U0123&gt; &gt; done" in t for t in texts), texts
    for text in texts:
        assert "<!channel>" not in text and "<http://evil" not in text and "<@U0123>" not in text
        assert "&" not in text.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "")


@pytest.mark.django_db
def test_it_stores_a_slack_url_only_encrypted_and_never_answers_it(receiver, outbox) -> None:
    url = receiver.url.replace("/hook", SLACK_PATH)
    status, created = api("POST", "/v1/subscriptions", {"allMyExperiments": True, "events": ["WORK_UNIT_FAILED"],
                                                         "slack": {"url": url}})
    assert status == 200, created
    with connection.cursor() as cursor:  # what someone reading the database (or a backup) sees
        cursor.execute(f"SELECT * FROM {Subscription._meta.db_table}")
        assert not any("secretXXXX" in str(column) for row in cursor.fetchall() for column in row)
    for answer in (created, api("GET", f"/v1/{created['name']}")[1], api("GET", "/v1/subscriptions")[1]):
        assert "secretXXXX" not in json.dumps(answer)
    assert created["slack"]["url"] == f"http://127.0.0.1:{receiver.port}/…XXXX"
    sub = Subscription.objects.get()
    assert channels.slack_url(sub) == url
    exp = factories.experiment()
    Experiment.objects.filter(id=exp.id).update(launch_state="COMPLETED")
    fail(factories.work_unit(exp))
    outbox.pump()
    assert [r.path for r in receiver.requests] == [SLACK_PATH]  # still delivered, to the real URL
    status, changed = api("PATCH", f"/v1/{created['name']}", {"slack": {"url": url + "2"}})
    assert status == 200 and "secretXXXX" not in json.dumps(changed)
    assert channels.slack_url(Subscription.objects.get()) == url + "2"


@pytest.mark.django_db
def test_it_says_until_when_a_rotated_secret_keeps_signing(receiver) -> None:
    status, created = api("POST", "/v1/subscriptions", {"allMyExperiments": True, "events": ["WORK_UNIT_FAILED"],
                                                         "webhook": {"url": receiver.url}})
    assert status == 200 and "previousSecretExpireTime" not in created
    before = timezone.now()
    status, rotated = api("POST", f"/v1/{created['name']}:rotateSecret")
    assert status == 200
    expires = Subscription.objects.get().previous_secret_expires
    assert expires is not None and timedelta(hours=24) <= expires - before < timedelta(hours=24, seconds=30)
    assert rotated["previousSecretExpireTime"] == expires.isoformat().replace("+00:00", "Z")
    assert "keeps signing beside the new one until" in rotated["previousSecretNote"]
    assert "(24 h after the rotation)" in rotated["previousSecretNote"]
    assert api("GET", f"/v1/{created['name']}")[1]["previousSecretExpireTime"] == rotated["previousSecretExpireTime"]
    Subscription.objects.update(previous_secret_expires=timezone.now() - timedelta(seconds=1))
    assert "previousSecretExpireTime" not in api("GET", f"/v1/{created['name']}")[1]


@pytest.mark.django_db(transaction=True)
def test_it_encrypts_the_slack_urls_of_existing_subscriptions_in_the_migration_and_keeps_them() -> None:
    call_command("migrate", "notifications", "0002", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {Subscription._meta.db_table} (owner, \"group\", scope, filter, events, channel, url, "
                "email, secret_encrypted, previous_secret_encrypted, queued_minutes, rate_limit_per_hour, enabled, "
                "create_time, update_time) VALUES (%s, '', 'MINE', '', '[\"WORK_UNIT_FAILED\"]', %s, %s, '', '', '', "
                "30, 60, true, now(), now()), (%s, '', 'MINE', '', '[\"WORK_UNIT_FAILED\"]', 'WEBHOOK', "
                "'https://hooks.example/x', '', %s, '', 30, 60, true, now(), now())",
                [ALICE, "SLACK", f"https://hooks.slack.com{SLACK_PATH}", ALICE, crypto.encrypt("whsec_x")])
    finally:
        call_command("migrate", "notifications", verbosity=0)
    slack, hook = Subscription.objects.order_by("id")
    assert channels.slack_url(slack) == f"https://hooks.slack.com{SLACK_PATH}"
    assert "secret" not in slack.url and slack.url == "https://hooks.slack.com/…XXXX"
    assert (hook.url, hook.url_encrypted) == ("https://hooks.example/x", "")
