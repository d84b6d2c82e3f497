"""Server-signed bearer tokens (JWT, HS256): issue and verify.

Called by the login flow's token endpoint (`xmc.auth.services`), by
``manage.py issue_token`` and, through `xmc.auth.identity.authenticate_bearer`,
by every API request.

The claims are ``email``, ``sub`` (the same email), ``iss``
(``settings.XMC_JWT_ISSUER``), ``iat``, ``exp``, ``jti`` (a random id, for
audit logs) and ``gen``, the email's token generation when the token was
signed: deleting or deactivating the user, or ``manage.py revoke_tokens
EMAIL``, raises the generation (`xmc.auth.services.do_revoke_tokens`) and
every token carrying a lower one is refused (a token without ``gen`` counts
as generation 0). ``email`` is a plain claim
because the real ``xmanager`` client reads the caller's email from the
*unverified* token to fill ``x-goog-user-email`` (the real xmanager client's behaviour, tests/system/real_client);
only this module's `decode_token` (called by the single verifier,
`xmc.auth.identity.authenticate_bearer`) decides whether a token is genuine.

The signing key is not ``SECRET_KEY`` itself but an HMAC of a purpose string
under it, so a token signature can never be replayed as (or confused with) a
Django session, password-reset or signed-cookie value, which all derive their
own keys from the same secret.
"""
from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass

import jwt
from django.conf import settings

from core.identity import normalize_email, validated_email
from xmc.models import TokenGeneration

ALGORITHM = "HS256"
_KEY_PURPOSE = b"xmc.auth.tokens.jwt-signing-key.v1"
# Tolerated clock difference between the host that signed and the one that
# verifies (``iat`` slightly in the future, ``exp`` slightly in the past).
LEEWAY_S = 10
_REQUIRED_CLAIMS = ["email", "iss", "iat", "exp"]


class InvalidToken(Exception):
    """A bearer token that must not be accepted; the message says why."""


@dataclass(frozen=True)
class TokenClaims:
    """The verified claims of a token (no database involved)."""

    email: str
    issuer: str
    issued_at: int
    expires_at: int
    generation: int = 0
    jti: str = ""


def signing_key() -> bytes:
    """The HS256 key: HMAC-SHA256 of a fixed purpose string under ``SECRET_KEY``."""
    return hmac.new(settings.SECRET_KEY.encode("utf-8"), _KEY_PURPOSE, hashlib.sha256).digest()


def issue_token(email: str, ttl_s: int | None = None, *, now: float | None = None,
                generation: int | None = None) -> str:
    """Sign a bearer token for ``email`` valid ``ttl_s`` seconds (default ``XMC_TOKEN_TTL_S``).

    ``email`` must be a valid address; it is signed in its normalized form.
    ``generation`` defaults to the email's current token generation (one
    query). ``now`` (epoch seconds) exists for tests that need an
    already-expired token.
    """
    email = validated_email(email)
    if generation is None:
        generation = current_generation(email)
    ttl = settings.XMC_TOKEN_TTL_S if ttl_s is None else int(ttl_s)
    if ttl <= 0:
        raise ValueError(f"token lifetime must be positive, got {ttl}")
    issued_at = int(time.time() if now is None else now)
    payload = {
        "email": email,
        "sub": email,
        "iss": settings.XMC_JWT_ISSUER,
        "iat": issued_at,
        "exp": issued_at + ttl,
        "jti": uuid.uuid4().hex,
        "gen": int(generation),
    }
    return jwt.encode(payload, signing_key(), algorithm=ALGORITHM)


def decode_token(token: str) -> TokenClaims:
    """Check signature, algorithm, issuer, expiry and the email claim; no database.

    Raises `InvalidToken` with one of: malformed, bad signature, expired, wrong
    issuer, missing claim, algorithm not allowed (``alg: none`` and anything but
    HS256 are refused before any signature check).

    A token that verified once is remembered (per process, with the key and
    issuer it verified under) until it expires: a client sends the same token
    on every call, and the signature check was a tenth of a GetWorkUnit's CPU.
    Expiry is still checked on every call; revocation is the token
    generation's job (`xmc.auth.identity.IDENTITY_CACHE`), not this cache's.
    """
    key = (token, settings.SECRET_KEY, settings.XMC_JWT_ISSUER)
    cached = _VERIFIED.get(key)
    if cached is not None:
        if time.time() <= cached.expires_at + LEEWAY_S:
            return cached
        _VERIFIED.pop(key, None)
    claims = _decode(token)
    if len(_VERIFIED) >= _VERIFIED_MAX:
        _VERIFIED.clear()  # a crude bound: many distinct live tokens just verify again
    _VERIFIED[key] = claims
    return claims


#: Tokens that verified: (token, secret, issuer) -> claims. Dict operations are atomic under the GIL.
_VERIFIED: dict[tuple[str, str, str], TokenClaims] = {}
_VERIFIED_MAX = 10_000


def _decode(token: str) -> TokenClaims:
    """`decode_token` without the cache."""
    try:
        payload = jwt.decode(
            token,
            signing_key(),
            algorithms=[ALGORITHM],
            issuer=settings.XMC_JWT_ISSUER,
            leeway=LEEWAY_S,
            options={"require": _REQUIRED_CLAIMS},
        )
    except jwt.ExpiredSignatureError as exc:
        raise InvalidToken("token expired") from exc
    except jwt.InvalidSignatureError as exc:
        raise InvalidToken("bad signature") from exc
    except jwt.InvalidIssuerError as exc:
        raise InvalidToken(f"wrong issuer (expected {settings.XMC_JWT_ISSUER!r})") from exc
    except jwt.MissingRequiredClaimError as exc:
        raise InvalidToken(f"missing claim {exc.claim!r}") from exc
    except jwt.InvalidAlgorithmError as exc:
        raise InvalidToken(f"algorithm not allowed (only {ALGORITHM})") from exc
    except jwt.ImmatureSignatureError as exc:
        raise InvalidToken("token issued in the future") from exc
    except jwt.DecodeError as exc:
        raise InvalidToken("malformed token") from exc
    except jwt.InvalidTokenError as exc:
        raise InvalidToken(f"invalid token ({exc})") from exc
    email = payload["email"]
    if not isinstance(email, str) or "@" not in email:
        raise InvalidToken("the email claim is not an email address")
    # This server signs normalized emails only: any other spelling is not ours.
    if normalize_email(email) != email:
        raise InvalidToken("the email claim is not in normalized form")
    generation = payload.get("gen", 0)
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise InvalidToken("the gen claim is not a generation")
    return TokenClaims(
        email=email,
        issuer=payload["iss"],
        issued_at=int(payload["iat"]),
        expires_at=int(payload["exp"]),
        generation=generation,
        jti=str(payload.get("jti", "")),
    )


def current_generation(email: str) -> int:
    """The token generation of ``email`` (0 when it was never revoked)."""
    value = TokenGeneration.objects.filter(email=normalize_email(email)).values_list("generation", flat=True).first()
    return int(value or 0)
