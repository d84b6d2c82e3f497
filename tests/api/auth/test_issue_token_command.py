"""``manage.py issue_token``: an operator prints a token that the API accepts."""
from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from xmc.auth.identity import authenticate_bearer
from xmc.auth.tokens import decode_token

pytestmark = pytest.mark.django_db


def _issue(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("issue_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_it_prints_only_a_token_that_verifies(oscar: Any) -> None:
    out, err = _issue("Oscar@Example.com")

    token = out.strip()
    assert out == token + "\n"
    identity = authenticate_bearer(f"Bearer {token}")
    assert identity.email == "oscar@example.com"
    assert identity.is_staff
    assert "token for oscar@example.com" in err


def test_it_honours_the_ttl() -> None:
    out, _ = _issue("ci-bot@example.com", "--ttl", "120")
    claims = decode_token(out.strip())
    assert claims.expires_at - claims.issued_at == 120


def test_it_warns_when_no_user_has_the_email() -> None:
    _, err = _issue("ci-bot@example.com")
    assert "no Django user has the email ci-bot@example.com" in err


def test_it_warns_that_a_deactivated_users_token_will_be_refused(make_user: Any) -> None:
    make_user("dora", "dora@example.com", is_active=False)
    _, err = _issue("dora@example.com")
    assert "deactivated" in err


@pytest.mark.parametrize(("args", "message"), [(("alice",), "not an email"), (("a@example.com", "--ttl", "0"), "positive")])
def test_it_refuses_bad_input(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        _issue(*args)
