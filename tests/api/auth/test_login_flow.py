"""`xmanager login`, served by Django: the CLI's exact requests, in both modes.

Each story follows the real xmanager client's behaviour, tests/system/real_client request by request: the probe,
the page the browser opens, sign-in, the one-time code, the exchange.
"""
from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import time_machine
from django.test import Client
from django.utils import timezone

from tests.api.auth.cli_steps import (
    authorize,
    cli_accepts_grant,
    code_from_page,
    csrf_token_of,
    exchange,
    login_path,
    pkce_pair,
)
from tests.fixtures.people import PASSWORD
from xmc.auth.identity import authenticate_bearer
from xmc.models import CliAuthorizationCode

pytestmark = pytest.mark.django_db


def _callback_query(response: Any, port: int) -> dict[str, str]:
    assert response.status_code == 302, response.content
    location = urlsplit(response["Location"])
    assert (location.scheme, location.netloc, location.path) == ("http", f"127.0.0.1:{port}", "/callback")
    return {key: values[0] for key, values in parse_qs(location.query).items()}


def _manual_code(client: Client, challenge: str) -> str:
    return code_from_page(authorize(client, login_path("state-1", challenge)))


def test_it_answers_the_cli_probe_with_400_and_says_what_the_page_needs() -> None:
    response = Client().get("/api/cli/login", follow=False)

    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_request"
    assert "code_challenge_method=S256" in body["error_description"]
    assert "mode=manual" in body["error_description"]


def test_it_logs_alice_in_with_a_pasted_code(alice: Any) -> None:
    browser, cli = Client(enforce_csrf_checks=True), Client(enforce_csrf_checks=True)
    verifier, challenge = pkce_pair()
    assert cli.get("/api/cli/login").status_code == 400  # the probe

    # Alice opens the printed URL: not signed in yet, so the sign-in page first.
    page = login_path("manual-state", challenge)
    to_signin = browser.get(page)
    assert to_signin.status_code == 302
    assert to_signin["Location"].startswith("/api/cli/signin?next=")
    form = browser.get(to_signin["Location"])
    assert form.status_code == 200 and b"Sign in to XMC" in form.content
    signed_in = browser.post(
        "/api/cli/signin",
        {"username": "alice", "password": PASSWORD, "next": page, "csrfmiddlewaretoken": csrf_token_of(form)},
    )
    assert signed_in.status_code == 302 and signed_in["Location"] == page

    # She confirms, and the page shows the one-time code she pastes into the terminal.
    code_page = authorize(browser, page)
    assert code_page.status_code == 200
    assert code_page["Cache-Control"].startswith("max-age=0")
    code = code_from_page(code_page)

    grant = exchange(cli, code, verifier)
    assert grant.status_code == 200
    body = grant.json()
    assert cli_accepts_grant(body)
    assert body["token_type"] == "bearer"
    assert body["email"] == "alice@example.com"
    assert body["expires_in"] == 30 * 24 * 3600
    assert grant["Cache-Control"] == "no-store"
    assert authenticate_bearer(f"Bearer {body['access_token']}").email == "alice@example.com"


def test_it_logs_alice_in_through_the_loopback_redirect(alice: Any) -> None:
    browser, cli = Client(enforce_csrf_checks=True), Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    verifier, challenge = pkce_pair()

    callback = _callback_query(authorize(browser, login_path("loop-state", challenge, port=53682)), 53682)
    assert callback["state"] == "loop-state"
    assert "error" not in callback

    body = exchange(cli, callback["code"], verifier).json()
    assert cli_accepts_grant(body)
    assert authenticate_bearer(f"Bearer {body['access_token']}").email == "alice@example.com"

    # The CLI's listener then sends the browser to the success page.
    done = browser.get("/api/cli/success")
    assert done.status_code == 200 and b"You are signed in" in done.content


def test_it_stores_only_a_hash_of_the_code(alice: Any) -> None:
    browser = Client()
    browser.force_login(alice)
    code = _manual_code(browser, pkce_pair()[1])

    row = CliAuthorizationCode.objects.get()
    assert code not in row.code_hash
    assert len(row.code_hash) == 64
    assert row.email == "alice@example.com"
    assert row.used_at is None
    assert row.expires_at - row.created_at == timedelta(seconds=300)


def test_it_refuses_a_verifier_that_does_not_match_the_challenge_without_burning_the_code(alice: Any) -> None:
    browser, cli = Client(), Client()
    browser.force_login(alice)
    verifier, challenge = pkce_pair()
    code = _manual_code(browser, challenge)

    wrong = exchange(cli, code, pkce_pair()[0])
    assert wrong.status_code == 400
    assert wrong.json() == {
        "error": "invalid_grant",
        "error_description": "code_verifier does not match the code_challenge (PKCE S256)",
    }
    # Somebody holding only the code cannot lock the real CLI out.
    assert exchange(cli, code, verifier).status_code == 200


def test_it_refuses_a_code_the_second_time(alice: Any) -> None:
    browser, cli = Client(), Client()
    browser.force_login(alice)
    verifier, challenge = pkce_pair()
    code = _manual_code(browser, challenge)
    assert exchange(cli, code, verifier).status_code == 200

    again = exchange(cli, code, verifier)
    assert again.status_code == 400
    assert again.json()["error"] == "invalid_grant"
    assert "already used" in again.json()["error_description"]


def test_it_refuses_an_expired_code(alice: Any) -> None:
    browser, cli = Client(), Client()
    browser.force_login(alice)
    verifier, challenge = pkce_pair()
    code = _manual_code(browser, challenge)

    with time_machine.travel(timezone.now() + timedelta(seconds=301)):
        late = exchange(cli, code, verifier)
    assert late.status_code == 400
    assert late.json()["error"] == "invalid_grant"
    assert "expired" in late.json()["error_description"]


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"grant_type": "password", "code": "x", "code_verifier": "y"}, "unsupported_grant_type"),
        ({"grant_type": "authorization_code", "code_verifier": "y" * 43}, "invalid_request"),
        ({"grant_type": "authorization_code", "code": "x"}, "invalid_request"),
        ({"grant_type": "authorization_code", "code": "no-such-code", "code_verifier": "v" * 43}, "invalid_grant"),
        ({"grant_type": "authorization_code", "code": "x", "code_verifier": "short"}, "invalid_grant"),
    ],
)
def test_it_answers_bad_exchanges_oauth_style(form: dict[str, str], error: str) -> None:
    response = Client().post("/api/cli/token", form, HTTP_ACCEPT="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == error
    assert response.json()["error_description"]


def test_it_wants_a_post_at_the_token_endpoint() -> None:
    response = Client().get("/api/cli/token")
    assert response.status_code == 405
    assert response.json()["error"] == "invalid_request"


def test_it_needs_no_csrf_token_for_the_exchange(alice: Any) -> None:
    browser, cli = Client(), Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    verifier, challenge = pkce_pair()
    assert exchange(cli, _manual_code(browser, challenge), verifier).status_code == 200


def test_it_sends_a_bad_challenge_method_back_to_the_cli_in_loopback_mode(alice: Any) -> None:
    browser = Client()
    browser.force_login(alice)
    _, challenge = pkce_pair()

    callback = _callback_query(browser.get(login_path("s", challenge, port=8765, method="plain")), 8765)
    assert callback["state"] == "s"
    assert "code" not in callback
    assert "code_challenge_method must be S256" in callback["error"]
    assert CliAuthorizationCode.objects.count() == 0


def test_it_redirects_a_missing_challenge_to_the_cli_even_before_sign_in() -> None:
    callback = _callback_query(Client().get("/api/cli/login?port=8765&state=s&code_challenge_method=S256"), 8765)
    assert "code_challenge must be an S256 challenge" in callback["error"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("mode=manual&state=s&code_challenge_method=plain&code_challenge=x", "code_challenge_method must be S256"),
        ("port=0&state=s&code_challenge_method=S256", "invalid port"),
        ("port=65536&state=s&code_challenge_method=S256", "invalid port"),
        ("port=http://evil.example&state=s", "invalid port"),
        ("port=8765&code_challenge_method=S256", "missing state"),
        ("mode=auto&state=s", "unsupported mode"),
        ("mode=manual&port=8765&state=s", "not both"),
        ("state=s&code_challenge_method=S256", "missing port"),
    ],
)
def test_it_shows_an_error_page_when_it_cannot_reach_the_cli(query: str, message: str) -> None:
    response = Client().get(f"/api/cli/login?{query}")
    assert response.status_code == 400
    assert message in response.content.decode()


def test_it_lets_alice_decline(alice: Any) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    path = login_path("s", pkce_pair()[1], port=9000)
    callback = _callback_query(authorize(browser, path, button="deny"), 9000)
    assert callback["error"].startswith("access_denied")
    assert CliAuthorizationCode.objects.count() == 0


def test_it_does_not_issue_a_code_on_a_get_or_without_csrf(alice: Any) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    path = login_path("s", pkce_pair()[1], port=9000)
    assert browser.get(path).status_code == 200
    assert browser.post(path, {"authorize": "1"}).status_code == 403
    assert CliAuthorizationCode.objects.count() == 0


def test_it_refuses_a_user_without_an_email(make_user: Any) -> None:
    browser = Client()
    browser.force_login(make_user("noemail", ""))
    response = browser.get(login_path("s", pkce_pair()[1]))
    assert response.status_code == 400
    assert "has no email address" in response.content.decode()


def test_it_does_not_redirect_sign_in_off_site(alice: Any) -> None:
    response = Client().post(
        "/api/cli/signin", {"username": "alice", "password": PASSWORD, "next": "https://evil.example/steal"}
    )
    assert response.status_code == 302
    assert response["Location"] == "/api/cli/success"


def test_it_tells_the_user_when_sign_in_failed_at_the_end() -> None:
    page = Client().get("/api/cli/success?error=<b>access_denied</b>")
    assert page.status_code == 200
    assert b"Sign-in failed" in page.content
    assert b"&lt;b&gt;access_denied&lt;/b&gt;" in page.content


def test_it_answers_the_probe_the_same_way_when_signed_in(alice: Any) -> None:
    browser = Client()
    browser.force_login(alice)
    response = browser.get("/api/cli/login")
    assert response.status_code == 400
    assert json.loads(response.content)["error"] == "invalid_request"
