"""Personas and helpers shared by the identity tests.

Alice is an ordinary researcher, Oscar an operator (Django staff, in the
"sre" group), Dora a deactivated user. Rate-limit tests use fresh emails so
buckets left in Redis by earlier runs never matter.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group

PASSWORD = "correct horse battery staple"


@pytest.fixture
def make_user(django_user_model: Any) -> Callable[..., Any]:
    def make(
        username: str,
        email: str,
        *,
        is_staff: bool = False,
        is_active: bool = True,
        groups: tuple[str, ...] = (),
    ) -> Any:
        user = django_user_model.objects.create_user(
            username=username, email=email, password=PASSWORD, is_staff=is_staff, is_active=is_active
        )
        for name in groups:
            group, _ = Group.objects.get_or_create(name=name)
            user.groups.add(group)
        return user

    return make


@pytest.fixture
def alice(make_user: Callable[..., Any]) -> Any:
    return make_user("alice", "alice@example.com")


@pytest.fixture
def oscar(make_user: Callable[..., Any]) -> Any:
    return make_user("oscar", "Oscar@Example.com", is_staff=True, groups=("sre", "ml-infra"))


@pytest.fixture
def fresh_email() -> Callable[[str], str]:
    """A new email per call: its rate-limit bucket has never been used."""
    return lambda who: f"{who}-{uuid.uuid4().hex[:12]}@example.com"
