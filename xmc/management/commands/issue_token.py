"""``manage.py issue_token EMAIL [--ttl SECONDS]``: print a bearer token for EMAIL.

For operators, service accounts and scripts (``XMC_AUTH_TOKEN=$(manage.py
issue_token ci@example.com)``); people normally use ``xmanager login``. The
token is the same server-signed JWT the login flow issues
(`xmc.auth.tokens.issue_token`). Only the token goes to stdout; notes go to
stderr so the output can be captured as is.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from xmc.auth.identity import normalize_email
from xmc.auth.tokens import issue_token


class Command(BaseCommand):
    help = "Print a bearer token (server-signed JWT) for EMAIL."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", help="the identity the token proves, e.g. alice@example.com")
        parser.add_argument(
            "--ttl",
            type=int,
            default=None,
            metavar="SECONDS",
            help="lifetime in seconds (default XMC_TOKEN_TTL_S)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        email: str = options["email"]
        ttl: int | None = options["ttl"]
        if ttl is not None and ttl <= 0:
            raise CommandError("--ttl must be a positive number of seconds")
        try:
            token = issue_token(email, ttl_s=ttl)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        email = normalize_email(email)
        self._note_on_user(email)
        lifetime = settings.XMC_TOKEN_TTL_S if ttl is None else ttl
        self.stderr.write(f"token for {email}, valid {lifetime} s")
        self.stdout.write(token)

    def _note_on_user(self, email: str) -> None:
        """Tell the operator on stderr what the token will be worth (advice only)."""
        users = get_user_model().objects.filter(email=email)
        try:
            has_user = users.exists()
            has_active_user = users.filter(is_active=True).exists()
        except DatabaseError as exc:
            self.stderr.write(f"note: could not look up Django users ({type(exc).__name__}); the token is valid anyway")
            return
        if not has_user:
            self.stderr.write(f"note: no Django user has the email {email}: the token grants no staff rights or "
                              "groups, only what experiment ACLs grant this email")
        elif not has_active_user:
            self.stderr.write(f"warning: the Django user with the email {email} is deactivated: the token will be refused")
