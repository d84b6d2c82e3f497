"""Failed sign-in throttling for ``/api/cli/signin`` and ``/admin/login/``.

Both forms (`ThrottledAuthenticationForm`, `ThrottledAdminAuthenticationForm`)
ask `check` before they check a password and call `record_failure` /
`record_success` after. Failures are counted in Redis (shared by every web
process) per account (the submitted username, hashed) and per client address
(``REMOTE_ADDR``: behind a proxy, have the proxy or gunicorn's
``--forwarded-allow-ips`` set it; ``X-Forwarded-For`` is not trusted here),
in a fixed window of ``XMC_LOGIN_FAILURE_WINDOW_S``. Past
``XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT`` or ``XMC_LOGIN_MAX_FAILURES_PER_ADDRESS``
every attempt is refused -- the right password too -- until the window ends.
A successful sign-in clears its account's count.

If Redis cannot be reached the throttle lets attempts through and logs it
(as the request rate limiter does, `core.ratelimit`): sign-in stays available.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any

import redis
from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest

logger = logging.getLogger(__name__)

KEY_PREFIX = "xmc:loginfail:v1:"


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)


def _keys(username: str, address: str) -> tuple[str, str]:
    account = hashlib.sha256(username.strip().casefold().encode("utf-8")).hexdigest()
    return f"{KEY_PREFIX}account:{account}", f"{KEY_PREFIX}address:{address}"


def client_address(request: HttpRequest | None) -> str:
    return (request.META.get("REMOTE_ADDR") or "unknown") if request is not None else "unknown"


def is_locked_out(username: str, address: str) -> int:
    """Seconds until ``username`` from ``address`` may try again (0: now)."""
    account_key, address_key = _keys(username, address)
    try:
        client = _client()
        pipe = client.pipeline()
        pipe.get(account_key)
        pipe.ttl(account_key)
        pipe.get(address_key)
        pipe.ttl(address_key)
        account, account_ttl, by_address, address_ttl = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("auth.login_throttle.redis_unavailable", extra={"error": str(exc)})
        return 0
    wait = 0
    if account is not None and int(account) >= settings.XMC_LOGIN_MAX_FAILURES_PER_ACCOUNT:
        wait = max(wait, int(account_ttl), 1)
    if by_address is not None and int(by_address) >= settings.XMC_LOGIN_MAX_FAILURES_PER_ADDRESS:
        wait = max(wait, int(address_ttl), 1)
    return wait


def record_failure(username: str, address: str) -> None:
    window = int(settings.XMC_LOGIN_FAILURE_WINDOW_S)
    try:
        pipe = _client().pipeline()
        for key in _keys(username, address):
            # The first failure opens the window; INCR keeps the key's TTL. (Not
            # ``EXPIRE ... NX``: that needs Redis 7, and XMC supports 6.2.)
            pipe.set(key, 0, ex=window, nx=True)
            pipe.incr(key)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("auth.login_throttle.redis_unavailable", extra={"error": str(exc)})
    logger.info("auth.login.failed", extra={"address": address})


def record_success(username: str, address: str) -> None:
    try:
        _client().delete(_keys(username, address)[0])
    except (redis.RedisError, OSError) as exc:
        logger.warning("auth.login_throttle.redis_unavailable", extra={"error": str(exc)})


class _ThrottleMixin:
    """Throttle ``AuthenticationForm.clean`` (needs ``self.request`` and ``cleaned_data``)."""

    request: HttpRequest | None
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request)
        if username:
            wait = is_locked_out(username, address)
            if wait:
                raise forms.ValidationError(
                    f"Too many failed sign-ins; try again in {max(1, round(wait / 60))} minute(s).",
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
    """``/api/cli/signin``'s form."""


class ThrottledAdminAuthenticationForm(_ThrottleMixin, AdminAuthenticationForm):
    """``/admin/login/``'s form (set as ``admin.site.login_form`` in `xmc.admin`)."""
