"""The two state changes of the ``xmanager login`` flow: issue a code, redeem it.

Called by the login views (`xmc.auth.views`). The code is a one-time,
short-lived (``XMC_LOGIN_CODE_TTL_S``) secret bound to a PKCE S256 challenge:
whoever redeems it must present the verifier the CLI generated, so a code seen
by somebody else (browser history, a shoulder, another local user's listener)
is worthless without it.

Redemption is single-use under concurrency: the code is claimed by one
conditional ``UPDATE ... WHERE used_at IS NULL AND expires_at > now``; of two
concurrent exchanges exactly one sees a row count of 1 and gets a token.
"""
from __future__ import annotations

import base64
import logging
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from xmc.auth.identity import Unauthenticated, clear_identity_cache, identity_for_email, normalize_email
from xmc.auth.tokens import issue_token
from xmc.models import CliAuthorizationCode, TokenGeneration

logger = logging.getLogger(__name__)

# RFC 7636: a verifier is 43..128 unreserved characters; an S256 challenge is
# the unpadded base64url of a SHA-256, always 43 characters.
_VERIFIER_RE = re.compile(r"^[A-Za-z0-9._~-]{43,128}$")
_S256_CHALLENGE_RE = re.compile(r"^[A-Za-z0-9_-]{43}$")
# Expired codes are kept this long (for the admin / debugging), then purged
# whenever a new code is issued: the table never grows without bound.
_EXPIRED_CODE_RETENTION = timedelta(days=1)


class InvalidGrant(Exception):
    """The code cannot be exchanged; the message is the OAuth ``error_description``."""


@dataclass(frozen=True)
class TokenGrant:
    """What ``POST /api/cli/token`` returns on success."""

    access_token: str
    email: str
    expires_in: int


def hash_code(code: str) -> str:
    """The stored form of a code: hex SHA-256."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def s256_challenge(code_verifier: str) -> str:
    """PKCE S256: unpadded base64url of SHA-256(verifier)."""
    digest = hashlib.sha256(code_verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def is_valid_s256_challenge(code_challenge: str) -> bool:
    return bool(_S256_CHALLENGE_RE.fullmatch(code_challenge))


def is_valid_code_verifier(code_verifier: str) -> bool:
    return bool(_VERIFIER_RE.fullmatch(code_verifier))


def do_issue_authorization_code(*, email: str, code_challenge: str, now: datetime | None = None) -> str:
    """Create a one-time code for ``email`` bound to ``code_challenge``; returns the plain code.

    The plain code leaves this function exactly once (to the page or the
    loopback redirect); only its hash is stored.
    """
    if not is_valid_s256_challenge(code_challenge):
        raise ValueError("code_challenge is not an S256 challenge")
    now = now or timezone.now()
    code = secrets.token_urlsafe(32)
    with transaction.atomic(durable=True):
        CliAuthorizationCode.objects.filter(expires_at__lt=now - _EXPIRED_CODE_RETENTION).delete()
        CliAuthorizationCode.objects.create(
            code_hash=hash_code(code),
            code_challenge=code_challenge,
            email=normalize_email(email),
            created_at=now,
            expires_at=now + timedelta(seconds=settings.XMC_LOGIN_CODE_TTL_S),
        )
    return code


def do_redeem_authorization_code(*, code: str, code_verifier: str, now: datetime | None = None) -> TokenGrant:
    """Exchange ``code`` + PKCE ``code_verifier`` for a bearer token, once.

    A wrong verifier does not burn the code: a code intercepted by a party
    without the verifier cannot be used to lock the real CLI out.
    """
    if not is_valid_code_verifier(code_verifier):
        raise InvalidGrant("malformed code_verifier (RFC 7636: 43-128 characters of [A-Za-z0-9-._~])")
    now = now or timezone.now()
    row = CliAuthorizationCode.objects.filter(code_hash=hash_code(code)).first()
    if row is None:
        raise InvalidGrant("unknown authorization code")
    if row.used_at is not None:
        raise InvalidGrant("authorization code already used; run `xmanager login` again")
    if row.expires_at <= now:
        raise InvalidGrant("authorization code expired; run `xmanager login` again")
    if not hmac.compare_digest(s256_challenge(code_verifier), row.code_challenge):
        raise InvalidGrant("code_verifier does not match the code_challenge (PKCE S256)")
    try:
        identity_for_email(row.email)
    except Unauthenticated as exc:
        raise InvalidGrant(str(exc)) from exc
    with transaction.atomic(durable=True):
        # The claim: of concurrent redeemers only one matches `used_at IS NULL`.
        claimed = CliAuthorizationCode.objects.filter(
            pk=row.pk, used_at__isnull=True, expires_at__gt=now
        ).update(used_at=now)
    if claimed != 1:
        raise InvalidGrant("authorization code already used; run `xmanager login` again")
    ttl = int(settings.XMC_TOKEN_TTL_S)
    return TokenGrant(access_token=issue_token(row.email, ttl_s=ttl), email=row.email, expires_in=ttl)


def do_revoke_tokens(email: str, *, reason: str = "revoked", now: datetime | None = None) -> int:
    """Raise ``email``'s token generation: every token issued before is refused from now on.

    Called by ``manage.py revoke_tokens`` and, through `xmc.auth.signals`, when
    a Django user is deleted, deactivated or changes email. Runs inside the
    caller's transaction when there is one (the admin's delete), so the
    revocation commits with the change that caused it. Returns the new
    generation.
    """
    email = normalize_email(email)
    now = now or timezone.now()
    with transaction.atomic():
        row, created = TokenGeneration.objects.select_for_update().get_or_create(
            email=email, defaults={"generation": 1, "changed_at": now, "reason": reason[:64]}
        )
        if not created:
            TokenGeneration.objects.filter(pk=row.pk).update(generation=F("generation") + 1, changed_at=now,
                                                             reason=reason[:64])
            row.refresh_from_db(fields=["generation"])
    # This process refuses the old tokens at once (cleared now and again at
    # commit, so no lookup in between re-caches the old generation); other
    # processes within XMC_IDENTITY_CACHE_S.
    clear_identity_cache()
    transaction.on_commit(clear_identity_cache)
    logger.info("auth.tokens.revoked", extra={"email": email, "generation": row.generation, "reason": reason})
    return int(row.generation)
