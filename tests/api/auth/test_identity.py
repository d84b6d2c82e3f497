"""The single verifier: Authorization header -> Identity with Django staff and groups."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from xmc.auth.identity import (
    Identity,
    Unauthenticated,
    authenticate_bearer,
    bound_identity,
    current_asserted_email,
    current_identity,
    current_identity_or_none,
)
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db


def test_it_knows_alice_as_a_plain_user(alice: Any) -> None:
    identity = authenticate_bearer(f"Bearer {issue_token('alice@example.com')}")
    assert identity == Identity(email="alice@example.com", is_staff=False, groups=frozenset())


def test_it_gives_oscar_his_staff_rights_and_groups_matching_his_email_case_insensitively(oscar: Any) -> None:
    identity = authenticate_bearer(f"bearer {issue_token('OSCAR@example.COM')}")
    assert identity.email == "oscar@example.com"
    assert identity.is_staff is True
    assert identity.groups == frozenset({"sre", "ml-infra"})


def test_it_accepts_a_service_account_without_a_django_user() -> None:
    identity = authenticate_bearer(f"Bearer {issue_token('ci-bot@robots.example.com')}")
    assert identity == Identity(email="ci-bot@robots.example.com")
    assert identity.domain == "robots.example.com"


def test_it_looks_the_user_up_with_one_query(oscar: Any, django_assert_num_queries: Any) -> None:
    header = f"Bearer {issue_token('oscar@example.com')}"
    with django_assert_num_queries(1):
        authenticate_bearer(header)


def test_it_refuses_the_token_of_a_deactivated_user(make_user: Any) -> None:
    make_user("dora", "dora@example.com", is_active=False)
    with pytest.raises(Unauthenticated, match="deactivated"):
        authenticate_bearer(f"Bearer {issue_token('dora@example.com')}")


def test_it_refuses_a_second_user_with_the_same_normalized_email(make_user: Any) -> None:
    make_user("eve", "eve@example.com")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_user("other-eve", "EVE@example.com")


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "missing bearer token"),
        ("", "missing bearer token"),
        ("Basic YWxpY2U6cHc=", "unsupported authorization scheme 'Basic'"),
        ("Bearer", "unsupported authorization scheme|empty bearer token"),
        ("Bearer    ", "unsupported authorization scheme|empty bearer token"),
        ("Bearer opaque-tok-123", "invalid bearer token: malformed token"),
    ],
)
def test_it_says_why_a_header_is_refused(header: str | None, reason: str) -> None:
    with pytest.raises(Unauthenticated, match=reason):
        authenticate_bearer(header)


def test_it_binds_the_identity_and_the_asserted_email_only_inside_the_block() -> None:
    assert current_identity_or_none() is None
    alice = Identity(email="alice@example.com")
    with bound_identity(alice, asserted_email="mallory@example.com"):
        assert current_identity() is alice
        assert current_asserted_email() == "mallory@example.com"
    assert current_identity_or_none() is None
    assert current_asserted_email() is None
    with pytest.raises(Unauthenticated):
        current_identity()


def test_it_asks_the_gate_before_looking_the_user_up(oscar: Any, django_assert_num_queries: Any) -> None:
    class Refused(Exception):
        pass

    seen: list[str] = []

    def refuse(email: str) -> None:
        seen.append(email)
        raise Refused

    # A refused call (the rate limiter's case) costs no query.
    header = f"Bearer {issue_token('oscar@example.com')}"
    with django_assert_num_queries(0), pytest.raises(Refused):
        authenticate_bearer(header, admit=refuse)
    assert seen == ["oscar@example.com"]
    # And a bad token never reaches the gate.
    with pytest.raises(Unauthenticated):
        authenticate_bearer("Bearer opaque-tok-123", admit=refuse)
    assert seen == ["oscar@example.com"]
