"""Models of the ``xmc`` app: the one-time codes of the ``xmanager login`` flow
and the token generation of each email.

Written only by `xmc.auth.services` (issue at ``GET /api/cli/login``, redeem at
``POST /api/cli/token``, revoke on user deletion/deactivation or
``manage.py revoke_tokens``); the views and tests never ``save()`` one themselves.
"""
from __future__ import annotations

from django.db import models

from core import limits


class CliAuthorizationCode(models.Model):
    """A one-time authorization code handed to the ``xmanager`` CLI (PKCE S256).

    Only the SHA-256 of the code is stored: a database leak does not leak
    redeemable codes. ``used_at`` is set by one conditional UPDATE when the code
    is redeemed, which is what makes a code single-use under concurrency.
    """

    code_hash = models.CharField(max_length=64, help_text="hex SHA-256 of the code; the code itself is never stored")
    code_challenge = models.CharField(max_length=128, help_text="PKCE S256 challenge sent by the CLI")
    email = models.EmailField(max_length=254, help_text="lower-cased email of the Django user who signed in")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["code_hash"], name="xmc_cliauthcode_unique_code_hash"),
        ]
        indexes = [
            models.Index(fields=["expires_at"], name="xmc_cliauthcode_expires_idx"),
        ]

    def __str__(self) -> str:
        state = "used" if self.used_at else "unused"
        return f"login code for {self.email} ({state}, expires {self.expires_at:%Y-%m-%d %H:%M:%S})"


class TokenGeneration(models.Model):
    """The token generation of one (normalized) email: tokens carrying a lower one are revoked.

    Keyed by email, not by user, on purpose: deleting the user must keep the
    revocation (a token for an email with no user is still a valid token for
    that email, granting what ACLs grant it). No row means generation 0.
    """

    email = models.CharField(max_length=limits.EMAIL, unique=True, help_text="NFKC + casefolded email")
    generation = models.PositiveIntegerField(default=0)
    changed_at = models.DateTimeField()
    reason = models.CharField(max_length=64, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.email}: generation {self.generation}"
