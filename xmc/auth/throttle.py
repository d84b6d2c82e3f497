"""Failed sign-in throttling for ``/api/cli/signin``, ``/login`` and ``/admin/login/``.

The forms (`ThrottledAuthenticationForm`, `ThrottledAdminAuthenticationForm`)
ask `wait_seconds` before they check a password and call `record_failure` /
`record_success` after. Counts live in Redis (shared by every web process),
keyed by the submitted username (hashed) and the client address
(`xmc.auth.proxies.client_address`: ``X-Forwarded-For`` only from
``XMC_TRUSTED_PROXIES``), in a window of ``XMC_LOGIN_FAILURE_WINDOW_S`` opened
by the first failure:

* **per (account, address)**: past ``XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT``
  failures, that address may not try that account again until the window
  ends -- the guesser is stopped, the owner elsewhere is not;
* **per address**: past ``XMC_LOGIN_MAX_FAILURES_PER_ADDRESS`` failures (one
  address trying many accounts), the address is refused for every account
  *it has not signed in to before*; people behind the same shared address who
  signed in from it keep signing in;
* **per account**, from every address: past
  ``XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT`` failures, an address the account
  never signed in from waits a delay that doubles with every further failure
  (1 s, 2 s, 4 s ... at most ``XMC_LOGIN_MAX_DELAY_S``) after the last one.
  A stranger spreading guesses over many addresses is slowed to one guess per
  delay; he cannot lock the account: its owner signs in at once from an
  address he used before, and after the delay from a new one.

A successful sign-in clears its account's counts (the pair and the
account-wide one; other addresses' pairs stay) and remembers the address as known for the account (``KNOWN_TTL_S``). A refused attempt checks no
password and counts nothing.

If Redis cannot be reached the throttle lets attempts through and logs it
(as the request rate limiter does, `core.ratelimit`): sign-in stays available.
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis
from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest

from xmc.auth.proxies import client_address

logger = logging.getLogger(__name__)

KEY_PREFIX = "xmc:loginfail:v2:"
# How long a successful sign-in keeps an address known for its account.
KNOWN_TTL_S = 30 * 24 * 3600


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)


@dataclass(frozen=True)
class _Keys:
    pair: str  # failures of this account from this address
    address: str  # failures from this address, any account
    account: str  # hash: failures of this account from anywhere, and the last one's time
    known: str  # set while this address signed in to this account lately


def _keys(username: str, address: str) -> _Keys:
    account = hashlib.sha256(username.strip().casefold().encode("utf-8")).hexdigest()
    return _Keys(
        pair=f"{KEY_PREFIX}pair:{account}:{address}",
        address=f"{KEY_PREFIX}address:{address}",
        account=f"{KEY_PREFIX}account:{account}",
        known=f"{KEY_PREFIX}known:{account}:{address}",
    )


def account_delay_s(failures: int) -> float:
    """The wait an unknown address owes after ``failures`` failures of one account."""
    excess = failures - int(settings.XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT)
    if excess < 0:
        return 0.0
    return float(min(2 ** min(excess, 30), int(settings.XMC_LOGIN_MAX_DELAY_S)))


def wait_seconds(username: str, address: str, *, now: float | None = None) -> int:
    """Seconds until ``username`` may be tried from ``address`` (0: now)."""
    now = time.time() if now is None else now
    keys = _keys(username, address)
    try:
        pipe = _client().pipeline()
        pipe.get(keys.pair)
        pipe.ttl(keys.pair)
        pipe.get(keys.address)
        pipe.ttl(keys.address)
        pipe.hmget(keys.account, ["failures", "last"])
        pipe.exists(keys.known)
        pair, pair_ttl, by_address, address_ttl, (failures, last), known = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("auth.login_throttle.redis_unavailable", extra={"error": str(exc)})
        return 0
    maximum = int(settings.XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT)
    if pair is not None and int(pair) >= maximum:
        return max(int(pair_ttl), 1)
    if known:
        return 0
    wait = 0.0
    if by_address is not None and int(by_address) >= int(settings.XMC_LOGIN_MAX_FAILURES_PER_ADDRESS):
        wait = max(wait, float(address_ttl), 1.0)
    if failures is not None and last is not None:
        wait = max(wait, float(last) + account_delay_s(int(failures)) - now)
    return int(wait + 0.999) if wait > 0 else 0


def record_failure(username: str, address: str, *, now: float | None = None) -> None:
    now = time.time() if now is None else now
    window = int(settings.XMC_LOGIN_FAILURE_WINDOW_S)
    keys = _keys(username, address)
    try:
        pipe = _client().pipeline()
        for key in (keys.pair, keys.address):
            # The first failure opens the window; INCR keeps the key's TTL. (Not
            # ``EXPIRE ... NX``: that needs Redis 7, and XMC supports 6.2.)
            pipe.set(key, 0, ex=window, nx=True)
            pipe.incr(key)
        pipe.hincrby(keys.account, "failures", 1)
        pipe.hset(keys.account, "last", repr(now))
        # The account's count lives a window past its latest failure.
        pipe.expire(keys.account, window)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("auth.login_throttle.redis_unavailable", extra={"error": str(exc)})
    logger.info("auth.login.failed", extra={"address": address})


def record_success(username: str, address: str) -> None:
    keys = _keys(username, address)
    try:
        pipe = _client().pipeline()
        pipe.delete(keys.pair, keys.account)
        pipe.set(keys.known, 1, ex=KNOWN_TTL_S)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("auth.login_throttle.redis_unavailable", extra={"error": str(exc)})


def _in_words(seconds: int) -> str:
    return f"{seconds} second(s)" if seconds < 120 else f"{round(seconds / 60)} minute(s)"


class _ThrottleMixin:
    """Throttle ``AuthenticationForm.clean`` (needs ``self.request`` and ``cleaned_data``)."""

    request: HttpRequest | None
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request)
        if username:
            wait = wait_seconds(username, address)
            if wait:
                raise forms.ValidationError(
                    f"Too many failed sign-ins; try again in {_in_words(wait)}.",
                    code="throttled",
                )
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            if username:
                record_failure(username, address)
            raise
        if username:
            record_success(username, address)
        return cleaned


class ThrottledAuthenticationForm(_ThrottleMixin, AuthenticationForm):
    """``/api/cli/signin``'s and ``/login``'s form."""


class ThrottledAdminAuthenticationForm(_ThrottleMixin, AdminAuthenticationForm):
    """``/admin/login/``'s form (set as ``admin.site.login_form`` in `xmc.admin`)."""
