"""REST of subscriptions: create (secret shown once), read/list/patch/delete of one's own only,
permission first on the experiment, SSRF refused naming the field, no input gives a 500."""
from __future__ import annotations

from typing import Any

import pytest

from notifications import crypto
from notifications.models import Subscription
from tests import factories
from tests.fixtures.people import Api, new_user

pytestmark = pytest.mark.django_db


def test_it_answers_the_secret_once_on_create_and_stores_it_encrypted(alice_api: Api, receiver) -> None:
    exp = factories.experiment()
    status, body = alice_api.answer("POST", "/v1/subscriptions", {
        "experiment": f"experiments/{exp.id}", "events": ["WORK_UNIT_FAILED", "EXPERIMENT_FINISHED"],
        "webhook": {"url": receiver.url}})
    assert status == 200, body
    assert body["name"].startswith("subscriptions/")
    assert body["experiment"] == f"experiments/{exp.id}"
    secret = body["webhookSecret"]
    assert secret.startswith("whsec_")
    sub = Subscription.objects.get(id=int(body["name"].split("/")[1]))
    assert secret not in sub.secret_encrypted and crypto.decrypt(sub.secret_encrypted) == secret
    status, again = alice_api.answer("GET", f"/v1/{body['name']}")
    assert status == 200 and "webhookSecret" not in again
    status, listed = alice_api.answer("GET", "/v1/subscriptions")
    assert [s["name"] for s in listed["subscriptions"]] == [body["name"]]
    assert all("webhookSecret" not in s for s in listed["subscriptions"])


def test_it_lets_a_subscriber_see_and_manage_only_their_own(alice_api: Api, bob_api: Api, receiver) -> None:
    exp = factories.experiment()
    _, body = alice_api.answer("POST", "/v1/subscriptions", {"experiment": f"experiments/{exp.id}",
                                                      "events": ["WORK_UNIT_FAILED"], "email": {}})
    name = body["name"]
    for method, url, payload in (("GET", f"/v1/{name}", None), ("PATCH", f"/v1/{name}", {"enabled": False}),
                                 ("DELETE", f"/v1/{name}", None), ("POST", f"/v1/{name}:test", None)):
        status, err = bob_api.answer(method, url, payload)
        assert status == 404 and err["error"]["status"] == "NOT_FOUND", (method, err)
    assert bob_api.answer("GET", "/v1/subscriptions")[1] == {"subscriptions": []}
    status, patched = alice_api.answer("PATCH", f"/v1/{name}", {"enabled": False, "quietHours": {"start": "22:00",
                                                                                        "end": "07:00"}})
    assert status == 200 and patched["enabled"] is False and patched["quietHours"] == {"start": "22:00",
                                                                                      "end": "07:00"}
    assert alice_api.answer("DELETE", f"/v1/{name}")[0] == 200
    assert alice_api.answer("GET", f"/v1/{name}")[0] == 404


def test_it_answers_not_found_not_a_500_for_a_subscription_named_with_other_digits(alice_api: Api) -> None:
    # "¹" and "٣" are digits to str.isdigit() but not to int(): the fuzz's PATCH of /v1/subscriptions/¹ was a 500.
    for sid in ("%C2%B9", "%D9%A3", "1%C2%B9"):
        for method, suffix, payload in (("GET", "", None), ("PATCH", "", {"enabled": False}), ("DELETE", "", None),
                                        ("POST", ":test", None), ("GET", "/deliveries", None)):
            status, err = alice_api.answer(method, f"/v1/subscriptions/{sid}{suffix}", payload)
            assert status == 404 and err["error"]["status"] == "NOT_FOUND", (method, sid, suffix, err)


def test_it_denies_subscribing_to_an_experiment_one_cannot_read_like_a_missing_one(bob_api: Api) -> None:
    exp = factories.experiment()  # Alice's, Bob has no role
    denied = bob_api.answer("POST", "/v1/subscriptions", {"experiment": f"experiments/{exp.id}",
                                                     "events": ["WORK_UNIT_FAILED"], "email": {}})
    missing = bob_api.answer("POST", "/v1/subscriptions", {"experiment": "experiments/999999",
                                                      "events": ["WORK_UNIT_FAILED"], "email": {}})
    assert denied[0] == missing[0] == 403
    assert denied[1]["error"]["status"] == "PERMISSION_DENIED"
    assert Subscription.objects.count() == 0


@pytest.mark.parametrize("url,fragment", [
    ("http://127.0.0.2/hook", "loopback"),
    ("http://10.1.2.3/hook", "private"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://[::1]/x", "loopback"),
    ("ftp://example.com/x", "http or https"),
    ("http://user:pw@example.com/x", "user name"),
    ("not a url", "http or https"),
])
def test_it_refuses_an_ssrf_target_with_a_clear_error_naming_the_field(alice_api: Api, url: str, fragment: str) -> None:
    status, body = alice_api.answer("POST", "/v1/subscriptions", {"allMyExperiments": True,
                                                             "events": ["WORK_UNIT_FAILED"], "webhook": {"url": url}})
    assert status == 400, body
    assert body["error"]["status"] == "INVALID_ARGUMENT"
    assert "webhook.url" in body["error"]["message"] and fragment in body["error"]["message"]
    assert body["error"]["details"][0]["fieldViolations"][0]["field"] == "webhook.url"
    assert Subscription.objects.count() == 0


def test_it_lets_a_listed_internal_host_through_by_the_allowed_hosts(alice_api: Api, settings) -> None:
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = ["10.1.2.3"]
    status, _ = alice_api.answer("POST", "/v1/subscriptions", {"allMyExperiments": True, "events": ["WORK_UNIT_FAILED"],
                                                          "slack": {"url": "http://10.1.2.3/services/T/B/x"}})
    assert status == 200


@pytest.mark.parametrize("body,field", [
    ({}, "events"),
    ({"events": "WORK_UNIT_FAILED", "email": {}, "allMyExperiments": True}, "events"),
    ({"events": ["NOPE"], "email": {}, "allMyExperiments": True}, "events"),
    ({"events": ["WORK_UNIT_FAILED"], "allMyExperiments": True}, "webhook"),
    ({"events": ["WORK_UNIT_FAILED"], "email": {}}, "experiment"),
    ({"events": ["WORK_UNIT_FAILED"], "email": {}, "experiment": "xp/1"}, "experiment"),
    ({"events": ["WORK_UNIT_FAILED"], "email": {}, "filter": "title = ("}, "filter"),
    ({"events": ["WORK_UNIT_FAILED"], "email": {}, "allMyExperiments": True, "quietHours": {"start": "25:00",
                                                                                           "end": "01:00"}},
     "quietHours.start"),
    ({"events": ["WORK_UNIT_FAILED"], "email": {}, "allMyExperiments": True, "queuedMinutes": 0}, "queuedMinutes"),
    ({"events": ["SCHEDULING_PAUSED"], "email": {}}, "events"),
    ({"events": ["WORK_UNIT_FAILED"], "email": {"address": "eve@example.com"}, "allMyExperiments": True},
     "email.address"),
    ({"bogus": 1}, "bogus"),
    ("[1, 2]", None),
    ("{not json", None),
])
def test_it_answers_bad_input_with_a_400_naming_the_field(alice_api: Api, body: Any, field: str | None) -> None:
    status, answer = alice_api.answer("POST", "/v1/subscriptions", body)
    assert status in (400, 403), answer
    if field is not None:
        assert answer["error"]["details"][0]["fieldViolations"][0]["field"] == field


def test_it_lets_staff_subscribe_to_the_scheduling_switch(db) -> None:

    new_user("olivia", is_staff=True)
    status, body = Api("olivia@example.com").answer("POST", "/v1/subscriptions", {
        "events": ["SCHEDULING_PAUSED", "SCHEDULING_RESUMED"], "email": {}})
    assert status == 200, body
    assert "experiment" not in body


def test_it_returns_a_new_secret_on_rotation_and_keeps_the_old_one_signing(alice_api: Api, receiver) -> None:
    _, body = alice_api.answer("POST", "/v1/subscriptions", {"allMyExperiments": True, "events": ["WORK_UNIT_FAILED"],
                                                        "webhook": {"url": receiver.url}})
    status, rotated = alice_api.answer("POST", f"/v1/{body['name']}:rotateSecret")
    assert status == 200 and rotated["webhookSecret"] != body["webhookSecret"]
    from notifications.channels import subscription_secrets

    sub = Subscription.objects.get(id=int(body["name"].split("/")[1]))
    assert subscription_secrets(sub) == [rotated["webhookSecret"], body["webhookSecret"]]
