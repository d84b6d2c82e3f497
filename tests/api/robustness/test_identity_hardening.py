"""One normalized, unique email per user; tokens carry a generation that deletion,
deactivation and ``revoke_tokens`` raise."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from experiments.acl import Role, role_of
from tests.fixtures.people import new_user
from xmc.auth.identity import Unauthenticated, authenticate_bearer, normalize_email
from xmc.auth.tokens import InvalidToken, decode_token, issue_token

pytestmark = pytest.mark.django_db


def test_it_folds_look_alike_emails_to_one_string() -> None:
    assert normalize_email(" \u017ftaff@Example.COM ") == "staff@example.com"  # long s
    assert normalize_email("\uff53taff@example.com") == "staff@example.com"  # full-width s


def test_it_gives_a_look_alike_email_no_staff_rights_of_another_user() -> None:
    new_user("staff", "staff@example.com", is_staff=True)
    # The look-alike normalizes to the very same string: it IS that user, so
    # nobody else can hold it: a second user with it is refused...
    with pytest.raises(Exception):
        new_user("mallory", "\u017ftaff@example.com")
    # ...and a token whose email claim is not normalized was not signed by us.
    import jwt

    from xmc.auth.tokens import ALGORITHM, signing_key
    forged = jwt.encode({"email": "STAFF@example.com", "iss": "xmc", "iat": 1, "exp": 2**40}, signing_key(),
                        algorithm=ALGORITHM)
    with pytest.raises(InvalidToken, match="normalized"):
        decode_token(forged)


def test_it_stores_the_normalized_email_and_matches_exactly() -> None:
    user = new_user("olga", "Olga@EXAMPLE.com", is_staff=True)
    user.refresh_from_db()
    assert user.email == "olga@example.com"
    identity = authenticate_bearer(f"Bearer {issue_token('OLGA@example.com')}")
    assert identity.is_staff


def test_it_refuses_emails_that_are_not_addresses() -> None:
    with pytest.raises(ValidationError):
        new_user("bad", "not-an-email")
    with pytest.raises(ValueError):
        issue_token("a@b@c")


def test_it_revokes_the_tokens_of_a_deleted_user_but_keeps_acl_grants_of_the_email() -> None:
    user = new_user("dan", "dan@example.com", is_staff=True)
    old = f"Bearer {issue_token('dan@example.com')}"
    assert authenticate_bearer(old).is_staff
    user.delete()
    with pytest.raises(Unauthenticated, match="revoked"):
        authenticate_bearer(old)
    # A token issued now, for the email with no user: valid, not staff, and
    # worth exactly what ACLs grant the email.
    identity = authenticate_bearer(f"Bearer {issue_token('dan@example.com')}")
    assert identity.is_staff is False
    assert role_of(identity, {"readers": [{"user": "dan@example.com"}]}) == Role.READER


def test_it_revokes_the_tokens_of_a_deactivated_user_for_good() -> None:
    user = new_user("erin", "erin@example.com")
    old = f"Bearer {issue_token('erin@example.com')}"
    user.is_active = False
    user.save()
    user.is_active = True
    user.save()
    with pytest.raises(Unauthenticated, match="revoked"):
        authenticate_bearer(old)
    authenticate_bearer(f"Bearer {issue_token('erin@example.com')}")


def test_it_revokes_tokens_with_the_command() -> None:
    old = f"Bearer {issue_token('ci@robots.example.com')}"
    out = StringIO()
    call_command("revoke_tokens", "CI@robots.example.com", stdout=out)
    assert "generation 1" in out.getvalue()
    with pytest.raises(Unauthenticated, match="revoked"):
        authenticate_bearer(old)
    claims = decode_token(issue_token("ci@robots.example.com"))
    assert claims.generation == 1 and claims.jti
