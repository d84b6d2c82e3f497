"""Does a request carry valid credentials? Asked before a large request body is read (`xmc.body_guard`).

Any of the web process's ways in counts: a bearer token of the API
(`xmc.auth.identity.authenticate_bearer`), a metrics writer's token
(`metrics.tokens.verify`), or the session cookie of a signed-in, active user
(the pages and the admin). Which route the request goes to, and whether this
caller may use it, is the view's business afterwards; this only decides
whether the server reads a large body at all.
"""
from __future__ import annotations

from http.cookies import CookieError, SimpleCookie
from importlib import import_module

from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.db import close_old_connections

from metrics import tokens
from xmc.auth.identity import Unauthenticated, authenticate_bearer


def carries_credentials(headers: dict[str, str]) -> bool:
    """True when ``headers`` (lower-case names) hold a token that verifies or a signed-in session's cookie."""
    try:
        return _bearer(headers.get("authorization", "")) or _session(headers.get("cookie", ""))
    finally:
        close_old_connections()  # runs outside a request: give back what Django would at a request's end


def _bearer(header: str) -> bool:
    if not header:
        return False
    scheme, _, credential = header.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() == "bearer" and tokens.looks_like_token(credential):
        return tokens.verify(credential) is not None
    try:
        authenticate_bearer(header)
    except Unauthenticated:
        return False
    return True


def _session(cookie_header: str) -> bool:
    try:
        morsel = SimpleCookie(cookie_header).get(settings.SESSION_COOKIE_NAME)
    except CookieError:
        return False
    if morsel is None or not morsel.value:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(morsel.value)
    user_id = store.get(SESSION_KEY)
    return user_id is not None and get_user_model().objects.filter(pk=user_id, is_active=True).exists()
