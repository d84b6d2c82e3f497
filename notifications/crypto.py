"""Secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from the app key.

The key is ``SHA-256("xmc-notifications-v1:" + SECRET_KEY)``; rotating
``XMC_SECRET_KEY`` therefore makes stored webhook secrets unreadable (the
subscriptions must rotate their secret), which is documented in
docs/architecture/notifications.md.
"""
from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    digest = hashlib.sha256(b"xmc-notifications-v1:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt(plain: str) -> str:
    return _fernet().encrypt(plain.encode()).decode()


def decrypt(token: str) -> str:
    """The plain text; ValueError when the token was not made with this app key."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError("the secret was encrypted under another app key") from None
