"""Standard Webhooks signatures (https://www.standardwebhooks.com/, "Signature scheme").

``webhook-signature`` = space-separated ``v1,<base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}"))>``
where ``key`` is the base64-decoded part of the ``whsec_...`` secret after the
prefix. During a rotation's overlap both the new and the previous secret sign,
so a receiver holding either verifies.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh ``whsec_`` + base64 of 32 random bytes."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret[len(PREFIX):] if secret.startswith(PREFIX) else secret)


def sign(secret: str, message_id: str, timestamp: int, body: str) -> str:
    """One ``v1,<base64>`` signature."""
    to_sign = f"{message_id}.{timestamp}.{body}".encode()
    return "v1," + base64.b64encode(hmac.new(_key(secret), to_sign, hashlib.sha256).digest()).decode()


def headers(secrets_: list[str], message_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The three Standard Webhooks headers, signed with every secret given (current first)."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, message_id, timestamp, body) for s in secrets_),
    }
