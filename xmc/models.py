"""Models of the ``xmc`` app: the one-time codes of the ``xmanager login`` flow.

Written only by `xmc.auth.services` (issue at ``GET /api/cli/login``, redeem at
``POST /api/cli/token``); the views and tests never ``save()`` one themselves.
"""
from __future__ import annotations

from django.db import models


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
