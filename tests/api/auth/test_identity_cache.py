"""The per-process identity cache: one lookup per XMC_IDENTITY_CACHE_S, revocation within that window."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from tests.api.auth.conftest import SERVICE
from xmc.auth.identity import IDENTITY_CACHE, Unauthenticated, authenticate_bearer
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(settings: Any) -> Iterator[FakeClock]:
    settings.XMC_IDENTITY_CACHE_S = 5.0
    fake = FakeClock()
    real = IDENTITY_CACHE.clock
    IDENTITY_CACHE.clock = fake
    try:
        yield fake
    finally:
        IDENTITY_CACHE.clock = real


def _header(email: str) -> str:
    return f"Bearer {issue_token(email)}"


def test_it_looks_a_caller_up_once_per_window(clock: FakeClock, alice: Any, django_assert_num_queries: Any) -> None:
    header = _header("alice@example.com")
    shouted = _header("ALICE@example.com")  # issuing reads the token generation: outside the counts
    with django_assert_num_queries(1):
        first = authenticate_bearer(header)
    with django_assert_num_queries(0):
        assert authenticate_bearer(header) == first
        assert authenticate_bearer(shouted) == first  # one entry per normalized email
    clock.now += 5.01
    with django_assert_num_queries(1):
        assert authenticate_bearer(header) == first


def test_it_honours_a_deactivation_made_elsewhere_within_the_window(clock: FakeClock, alice: Any) -> None:
    header = _header("alice@example.com")
    authenticate_bearer(header)
    # Another process deactivates her: a queryset update sends no signal to this one.
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    clock.now += 4.9
    assert authenticate_bearer(header).email == "alice@example.com"  # still inside the window
    clock.now += 0.2
    with pytest.raises(Unauthenticated, match="deactivated"):
        authenticate_bearer(header)


def test_it_remembers_a_refusal_for_the_window_too(clock: FakeClock, make_user: Any,
                                                   django_assert_num_queries: Any) -> None:
    dora = make_user("dora", "dora@example.com", is_active=False)
    header = _header("dora@example.com")
    with django_assert_num_queries(1), pytest.raises(Unauthenticated, match="deactivated"):
        authenticate_bearer(header)
    get_user_model().objects.filter(pk=dora.pk).update(is_active=True)
    with django_assert_num_queries(0), pytest.raises(Unauthenticated, match="deactivated"):
        authenticate_bearer(header)
    clock.now += 5.01
    assert authenticate_bearer(header).email == "dora@example.com"


def test_it_forgets_at_once_when_this_process_changes_a_user_or_their_groups(clock: FakeClock, alice: Any) -> None:
    header = _header("alice@example.com")
    assert authenticate_bearer(header).groups == frozenset()
    alice.groups.add(Group.objects.create(name="ml-team"))
    assert authenticate_bearer(header).groups == frozenset({"ml-team"})
    alice.is_staff = True
    alice.save()
    assert authenticate_bearer(header).is_staff is True
    alice.is_active = False
    alice.save()  # deactivation also revokes her tokens (xmc.auth.signals): either refusal will do
    with pytest.raises(Unauthenticated, match="deactivated|revoked"):
        authenticate_bearer(header)


def test_it_does_not_cache_when_the_window_is_zero(settings: Any, alice: Any, django_assert_num_queries: Any) -> None:
    settings.XMC_IDENTITY_CACHE_S = 0
    header = _header("alice@example.com")
    with django_assert_num_queries(2):
        authenticate_bearer(header)
        authenticate_bearer(header)


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_revoked_caller_over_grpc_once_the_window_has_passed(
    settings: Any, channel: grpc.Channel, alice: Any
) -> None:
    window_s = 1.0
    settings.XMC_IDENTITY_CACHE_S = window_s
    call = channel.unary_unary(f"/{SERVICE}/Get")
    metadata = [("authorization", _header("alice@example.com"))]
    first_call_at = time.monotonic()
    call(b"", metadata=metadata, timeout=10)  # caches her identity in the server's process
    deactivated_at = time.monotonic()
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)  # as another process would
    deadline = deactivated_at + window_s + 20  # generous: a loaded machine
    while True:
        try:
            call(b"", metadata=metadata, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "deactivated" in (exc.details() or "")
            refused_at = time.monotonic()
            break
        assert time.monotonic() < deadline, "the revocation never took effect"
        time.sleep(0.05)
    # The cached identity was served until its window ran out, not one lookup longer.
    assert refused_at - first_call_at >= window_s
