"""``manage.py revoke_tokens EMAIL``: every token issued for EMAIL so far stops working.

A thin shell over `xmc.auth.services.do_revoke_tokens` (raises the email's
token generation). New tokens (``xmanager login``, ``issue_token``) work again
at once; to keep a person out, deactivate their user too.
"""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from xmc.auth.identity import validated_email
from xmc.auth.services import do_revoke_tokens


class Command(BaseCommand):
    help = "Revoke every bearer token issued for EMAIL so far."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", help="the identity whose tokens to revoke")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            email = validated_email(options["email"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        generation = do_revoke_tokens(email, reason="revoke_tokens command")
        self.stdout.write(f"revoked every token of {email} issued so far (token generation {generation})")
