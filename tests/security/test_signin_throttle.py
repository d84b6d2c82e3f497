"""Issue 40, item 6: sign-in throttling an attacker cannot turn against an account or bypass.

The attacks: five wrong passwords lock ``admin`` for everyone; a changing
``X-Forwarded-For`` gives every guess a fresh address; one guesser behind a
shared address locks out everyone behind it. Mallory is the attacker, Alice
the account's owner (``fresh_staff_user``, tests/fixtures/people.py: staff, under a
username no earlier test's throttle counted). Addresses are fresh per test so Redis
counts of earlier runs never matter.
"""
from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from django.test import Client

from tests.fixtures.people import PASSWORD
from tests.api.auth.conftest import _fast_password_hashing as _fast_password_hashing  # noqa: F401

pytestmark = pytest.mark.django_db

URLS = ["/api/cli/signin", "/admin/login/", "/login"]


def fresh_address() -> str:
    return f"198.{random.randint(18, 19)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def sign_in(url: str, username: str, password: str, address: str, **headers: str) -> tuple[bool, str]:
    meta: dict[str, Any] = {"REMOTE_ADDR": address, **headers}
    response = Client(**meta).post(url, {"username": username, "password": password})
    return response.status_code == 302, response.content.decode()


@pytest.mark.parametrize("url", URLS)
def test_it_lets_the_owner_sign_in_while_a_stranger_guesses_his_password(url: str, fresh_staff_user: Any) -> None:
    home = fresh_address()
    assert sign_in(url, fresh_staff_user.username, PASSWORD, home)[0]  # Alice's usual address
    mallory = fresh_address()
    for _ in range(8):
        sign_in(url, fresh_staff_user.username, "wrong password", mallory)
    # Mallory is stopped, even with the right password ...
    ok, page = sign_in(url, fresh_staff_user.username, PASSWORD, mallory)
    assert not ok and "Too many failed sign-ins" in page
    # ... Alice is not.
    assert sign_in(url, fresh_staff_user.username, PASSWORD, home)[0]


def test_it_only_delays_a_new_address_and_never_locks_the_account(fresh_staff_user: Any, settings: Any) -> None:
    settings.XMC_LOGIN_MAX_DELAY_S = 60
    url = URLS[0]
    # Mallory spreads fifty guesses over fifty addresses, one a second.
    with time_machine.travel(time.time(), tick=False) as clock:
        for _ in range(50):
            sign_in(url, fresh_staff_user.username, "guess", fresh_address())
            clock.shift(1)
        # From a laptop Alice never used, she waits at most the delay ...
        laptop = fresh_address()
        ok, page = sign_in(url, fresh_staff_user.username, PASSWORD, laptop)
        assert not ok and "try again in" in page
        assert "minute" not in page
        clock.shift(settings.XMC_LOGIN_MAX_DELAY_S + 1)
        # ... and then she is in.
        assert sign_in(url, fresh_staff_user.username, PASSWORD, laptop)[0]


def test_it_ignores_x_forwarded_for_from_an_address_that_is_no_trusted_proxy(fresh_staff_user: Any, settings: Any) -> None:
    settings.XMC_LOGIN_MAX_FAILURES_PER_ADDRESS = 4
    settings.XMC_TRUSTED_PROXIES = []
    for i in range(4):
        sign_in(URLS[0], f"nobody-{uuid.uuid4().hex}", "guess", "127.0.0.1", HTTP_X_FORWARDED_FOR=fresh_address())
    # The fifth guess, from "yet another address", is still counted against 127.0.0.1.
    ok, page = sign_in(URLS[0], fresh_staff_user.username, PASSWORD, "127.0.0.1", HTTP_X_FORWARDED_FOR=fresh_address())
    assert not ok and "Too many failed sign-ins" in page
    # (Clean up: 127.0.0.1 is shared by the other tests of this run.)
    import redis

    redis.Redis.from_url(settings.REDIS_URL).delete("xmc:loginfail:v2:address:127.0.0.1")


def test_it_takes_the_client_from_x_forwarded_for_of_a_trusted_proxy_only(fresh_staff_user: Any, settings: Any) -> None:
    settings.XMC_LOGIN_MAX_FAILURES_PER_ADDRESS = 3
    settings.XMC_TRUSTED_PROXIES = ["10.20.0.0/16"]
    mallory = fresh_address()
    for _ in range(3):
        # Mallory prepends a made-up address; the proxy appends the one it saw.
        sign_in(URLS[0], f"nobody-{uuid.uuid4().hex}", "guess", "10.20.0.5",
                HTTP_X_FORWARDED_FOR=f"{fresh_address()}, {mallory}")
    assert not sign_in(URLS[0], fresh_staff_user.username, PASSWORD, "10.20.0.6", HTTP_X_FORWARDED_FOR=mallory)[0]
    # Everyone else behind the proxy is another client.
    assert sign_in(URLS[0], fresh_staff_user.username, PASSWORD, "10.20.0.5", HTTP_X_FORWARDED_FOR=fresh_address())[0]


def test_it_keeps_people_who_signed_in_from_a_shared_address_signing_in(
    fresh_staff_user: Any, make_user: Callable[..., Any], settings: Any
) -> None:
    settings.XMC_LOGIN_MAX_FAILURES_PER_ADDRESS = 5
    office = fresh_address()
    assert sign_in(URLS[0], fresh_staff_user.username, PASSWORD, office)[0]
    for _ in range(10):  # Mallory, behind the same NAT, sprays accounts.
        sign_in(URLS[0], f"nobody-{uuid.uuid4().hex}", "guess", office)
    assert sign_in(URLS[0], fresh_staff_user.username, PASSWORD, office)[0]
    # An account never used from there waits out the window.
    name = f"bob{uuid.uuid4().hex[:8]}"
    make_user(name, f"{name}@example.com")
    ok, page = sign_in(URLS[0], name, PASSWORD, office)
    assert not ok and "Too many failed sign-ins" in page


@pytest.mark.django_db(transaction=True)
def test_it_counts_the_connection_address_behind_the_real_web_server(settings: Any, tmp_path: Any) -> None:
    """The bypass as reported: gunicorn on 127.0.0.1 took the address from ``X-Forwarded-For``."""
    import re

    import redis
    import requests

    from tests.security.web_server import web_server

    redis.Redis.from_url(settings.REDIS_URL).delete("xmc:loginfail:v2:address:127.0.0.1")
    try:
        with web_server(tmp_path / "web.log", XMC_LOGIN_MAX_FAILURES_PER_ADDRESS="3", XMC_TRUSTED_PROXIES="") as (
                base, _):
            session = requests.Session()

            def attempt() -> str:
                form = session.get(f"{base}/api/cli/signin", timeout=10).text
                token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
                assert token, form
                return session.post(
                    f"{base}/api/cli/signin",
                    data={"csrfmiddlewaretoken": token.group(1), "username": f"nobody-{uuid.uuid4().hex}",
                          "password": "guess"},
                    headers={"X-Forwarded-For": fresh_address(), "Referer": f"{base}/api/cli/signin"},
                    allow_redirects=False, timeout=10,
                ).text

            for _ in range(3):
                assert "Too many failed sign-ins" not in attempt()
            assert "Too many failed sign-ins" in attempt()
    finally:
        redis.Redis.from_url(settings.REDIS_URL).delete("xmc:loginfail:v2:address:127.0.0.1")


def test_it_runs_every_web_server_with_the_worker_that_ignores_forwarded_headers() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in ("scripts/run_all.py", "deploy/base/web.yaml", "Dockerfile"):
        text = (root / path).read_text()
        assert "xmc.web_worker.UvicornWorker" in text and "uvicorn_worker.UvicornWorker" not in text, path
