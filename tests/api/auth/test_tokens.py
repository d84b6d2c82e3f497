"""Bearer tokens: what we sign, and every way a token is refused."""
from __future__ import annotations

import base64
import json
import time

import jwt
import pytest
from django.test import override_settings

from xmc.auth.identity import authenticate_bearer
from xmc.auth.tokens import ALGORITHM, InvalidToken, decode_token, issue_token, signing_key

# issue_token reads the email's token generation (revocation) from the database.
pytestmark = pytest.mark.django_db


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_it_signs_a_token_whose_email_the_real_client_can_read_without_the_key() -> None:
    token = issue_token("Alice@Example.com", ttl_s=600)

    # The xmanager client decodes the payload unverified (contract 1.3).
    unverified = jwt.decode(token, options={"verify_signature": False})
    assert unverified["email"] == "alice@example.com"
    assert unverified["sub"] == "alice@example.com"
    assert unverified["iss"] == "xmc"
    assert unverified["exp"] - unverified["iat"] == 600
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


def test_it_uses_the_default_lifetime_from_settings() -> None:
    with override_settings(XMC_TOKEN_TTL_S=1234):
        claims = decode_token(issue_token("alice@example.com"))
    assert claims.expires_at - claims.issued_at == 1234


def test_it_does_not_sign_with_the_raw_django_secret() -> None:
    token = issue_token("alice@example.com")
    from django.conf import settings

    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, settings.SECRET_KEY, algorithms=["HS256"])
    assert signing_key() != settings.SECRET_KEY.encode()


@pytest.mark.django_db
def test_it_verifies_a_good_token_into_an_identity() -> None:
    identity = authenticate_bearer(f"Bearer {issue_token('alice@example.com')}")  # the single verifier
    assert identity.email == "alice@example.com"
    assert identity.domain == "example.com"
    assert identity.is_staff is False
    assert identity.groups == frozenset()


def test_it_refuses_an_expired_token() -> None:
    token = issue_token("alice@example.com", ttl_s=60, now=time.time() - 3600)
    with pytest.raises(InvalidToken, match="expired"):
        decode_token(token)


def test_it_refuses_a_tampered_payload() -> None:
    header, _, signature = issue_token("alice@example.com").split(".")
    forged = _b64({"email": "oscar@example.com", "iss": "xmc", "iat": int(time.time()), "exp": int(time.time()) + 60})
    with pytest.raises(InvalidToken, match="bad signature"):
        decode_token(f"{header}.{forged}.{signature}")


def test_it_refuses_a_token_signed_with_another_key() -> None:
    with override_settings(SECRET_KEY="another-deployment-secret"):
        token = issue_token("alice@example.com")
    with pytest.raises(InvalidToken, match="bad signature"):
        decode_token(token)


def test_it_refuses_a_token_from_another_issuer() -> None:
    with override_settings(XMC_JWT_ISSUER="someone-else"):
        token = issue_token("alice@example.com")
    with pytest.raises(InvalidToken, match="wrong issuer"):
        decode_token(token)


def test_it_refuses_a_token_without_an_email() -> None:
    now = int(time.time())
    token = jwt.encode({"sub": "alice", "iss": "xmc", "iat": now, "exp": now + 60}, signing_key(), algorithm=ALGORITHM)
    with pytest.raises(InvalidToken, match="missing claim 'email'"):
        decode_token(token)


def test_it_refuses_an_email_claim_that_is_not_an_email() -> None:
    now = int(time.time())
    token = jwt.encode({"email": "alice", "iss": "xmc", "iat": now, "exp": now + 60}, signing_key(), algorithm=ALGORITHM)
    with pytest.raises(InvalidToken, match="not an email"):
        decode_token(token)


def test_it_refuses_an_unsigned_alg_none_token() -> None:
    now = int(time.time())
    claims = {"email": "oscar@example.com", "iss": "xmc", "iat": now, "exp": now + 60}
    token = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."
    with pytest.raises(InvalidToken, match="algorithm not allowed"):
        decode_token(token)


def test_it_refuses_hs512_even_with_the_right_key() -> None:
    now = int(time.time())
    claims = {"email": "alice@example.com", "iss": "xmc", "iat": now, "exp": now + 60}
    with pytest.raises(InvalidToken, match="algorithm not allowed"):
        decode_token(jwt.encode(claims, signing_key(), algorithm="HS512"))


@pytest.mark.parametrize("garbage", ["", "not-a-jwt", "a.b.c", "opaque-tok-123", "e30.e30"])
def test_it_refuses_malformed_tokens(garbage: str) -> None:
    with pytest.raises(InvalidToken, match="malformed|algorithm"):
        decode_token(garbage)


def test_it_refuses_to_issue_for_something_that_is_not_an_email() -> None:
    with pytest.raises(ValueError):
        issue_token("alice")
    with pytest.raises(ValueError):
        issue_token("alice@example.com", ttl_s=0)


def test_it_verifies_a_token_once_and_still_refuses_it_once_expired(monkeypatch: pytest.MonkeyPatch) -> None:
    import time_machine

    token = issue_token("alice@example.com", ttl_s=60)
    calls: list[str] = []
    real_decode = jwt.decode
    monkeypatch.setattr(jwt, "decode", lambda *a, **kw: calls.append("decode") or real_decode(*a, **kw))
    first = decode_token(token)
    assert decode_token(token) == first
    assert calls == ["decode"]  # the second call was answered from the cache of verified tokens
    with time_machine.travel(first.expires_at + 11):  # past exp and the leeway
        with pytest.raises(InvalidToken, match="expired"):
            decode_token(token)


def test_it_does_not_accept_under_another_key_a_token_verified_under_one() -> None:
    token = issue_token("alice@example.com")
    decode_token(token)
    with override_settings(SECRET_KEY="another-secret-key-" + "x" * 40):
        with pytest.raises(InvalidToken, match="bad signature"):
            decode_token(token)
