"""Failed sign-ins are throttled per account and per client address, in Redis."""
from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import time_machine
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client

from tests.fixtures.people import PASSWORD

pytestmark = pytest.mark.django_db

URLS = ["/api/cli/signin", "/admin/login/"]


def sign_in(client: Client, url: str, username: str, password: str) -> bool:
    response = client.post(url, {"username": username, "password": password})
    return response.status_code == 302


@pytest.mark.parametrize("url", URLS)
def test_it_locks_an_account_after_too_many_failures(url: str, fresh_staff_user: Any, settings: Any) -> None:
    settings.XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT = 3
    client = Client(REMOTE_ADDR=f"10.0.{uuid.uuid4().int % 250}.1")
    # The clock stands still: the new address's wait is a second, which a loaded machine
    # could spend between two requests (the wait's length is tests/security's subject).
    with time_machine.travel(time.time(), tick=False):
        for _ in range(3):
            assert not sign_in(client, url, fresh_staff_user.username, "wrong password")
        # Even the right password is refused now, from that address for the window and,
        # for a moment that grows with each failure, from an address the account never
        # used (tests/security/test_signin_throttle.py: never from a known one).
        assert not sign_in(client, url, fresh_staff_user.username, PASSWORD)
        response = Client(REMOTE_ADDR="10.9.9.9").post(url, {"username": fresh_staff_user.username, "password": PASSWORD})
    assert response.status_code == 200
    assert "Too many failed sign-ins" in response.content.decode()


@pytest.mark.parametrize("url", URLS)
def test_it_locks_an_address_that_tries_many_accounts(url: str, fresh_staff_user: Any, settings: Any) -> None:
    settings.XMC_LOGIN_MAX_FAILURES_PER_ADDRESS = 4
    address = f"10.1.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"
    client = Client(REMOTE_ADDR=address)
    for i in range(4):
        assert not sign_in(client, url, f"nobody-{uuid.uuid4().hex}", "guess")
    assert not sign_in(client, url, fresh_staff_user.username, PASSWORD)
    assert sign_in(Client(REMOTE_ADDR="10.200.0.1"), url, fresh_staff_user.username, PASSWORD)


def test_it_clears_the_account_count_on_success(fresh_staff_user: Any, settings: Any) -> None:
    settings.XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT = 3
    client = Client(REMOTE_ADDR="10.3.0.1")
    for _ in range(2):
        assert not sign_in(client, URLS[0], fresh_staff_user.username, "wrong")
    assert sign_in(client, URLS[0], fresh_staff_user.username, PASSWORD)
    for _ in range(2):
        assert not sign_in(Client(REMOTE_ADDR="10.3.0.2"), URLS[0], fresh_staff_user.username, "wrong")
    assert sign_in(Client(REMOTE_ADDR="10.3.0.3"), URLS[0], fresh_staff_user.username, PASSWORD)


def test_it_opens_the_window_at_the_first_failure_and_never_extends_it(fresh_staff_user: Any, settings: Any) -> None:
    import redis

    from xmc.auth import throttle

    settings.XMC_LOGIN_FAILURE_WINDOW_S = 120
    account_key = throttle._keys(fresh_staff_user.username, "10.4.0.1").pair
    client = redis.Redis.from_url(settings.REDIS_URL)
    throttle.record_failure(fresh_staff_user.username, "10.4.0.1")
    first_ttl = client.ttl(account_key)
    assert 0 < first_ttl <= 120
    client.expire(account_key, 30)  # as if 90 s had passed
    throttle.record_failure(fresh_staff_user.username, "10.4.0.1")
    assert int(client.get(account_key)) == 2
    assert 0 < client.ttl(account_key) <= 30


def test_it_validates_passwords() -> None:
    with pytest.raises(ValidationError):
        validate_password("123")
    with pytest.raises(ValidationError):
        validate_password("password")
