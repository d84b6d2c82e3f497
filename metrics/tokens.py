"""Per-execution metrics tokens and the environment every container gets.

The actuator (``k8s_bridge.actuator.handlers``) adds `execution_env` to every
container of the JobSet it builds: ``XMC_METRICS_URL``, ``XMC_XID``,
``XMC_WID``, ``XMC_EID`` and ``XMC_METRICS_TOKEN``. The token names one
execution and carries an HMAC under a key derived from ``SECRET_KEY``; it is
deterministic (the same execution always gets the same token, so a re-sent
create task builds the same manifest) and holds no expiry of its own: the
write path (`metrics.services.accepting_execution`) refuses it once the
execution has ended plus ``XMC_METRICS_TOKEN_GRACE_S``. It can write the
metrics of that one execution and do nothing else: it is not a bearer token
of the API (no ``email`` claim, not a JWT).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re

from django.conf import settings

from core.keys import ExecutionKey

PREFIX = "xmcm1"
_KEY_PURPOSE = b"xmc metrics token v1"
_TOKEN = re.compile(rf"{PREFIX}\.([0-9]{{1,19}})\.([0-9]{{1,19}})\.([0-9]{{1,19}})\.([A-Za-z0-9_-]{{43}})")


def _key() -> bytes:
    return hmac.new(settings.SECRET_KEY.encode("utf-8"), _KEY_PURPOSE, hashlib.sha256).digest()


def _signature(xid: int, wid: int, eid: int) -> str:
    digest = hmac.new(_key(), f"{xid}.{wid}.{eid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def token_for(xid: int, wid: int, eid: int) -> str:
    return f"{PREFIX}.{xid}.{wid}.{eid}.{_signature(xid, wid, eid)}"


def looks_like_token(value: str) -> bool:
    """A metrics token (and not a user's bearer JWT)."""
    return value.startswith(PREFIX + ".")


def verify(value: str) -> ExecutionKey | None:
    """The execution a metrics token names, or None if it is malformed or its signature is wrong."""
    match = _TOKEN.fullmatch(value)
    if match is None:
        return None
    xid, wid, eid = (int(g) for g in match.groups()[:3])
    # The whole token must be the one this server issues: ``xmcm1.007...`` names the same ids as
    # ``xmcm1.7...`` but is not it (one execution, one token string, as logs and revocations see it).
    if not hmac.compare_digest(value.encode(), token_for(xid, wid, eid).encode()):
        return None
    return ExecutionKey(xid, wid, eid)


def execution_env(xid: int, wid: int, eid: int) -> tuple[tuple[str, str], ...]:
    """The variables every container of execution (xid, wid, eid) gets, in this order."""
    return (
        ("XMC_METRICS_URL", settings.XMC_METRICS_URL.rstrip("/")),
        ("XMC_XID", str(xid)),
        ("XMC_WID", str(wid)),
        ("XMC_EID", str(eid)),
        ("XMC_METRICS_TOKEN", token_for(xid, wid, eid)),
    )
