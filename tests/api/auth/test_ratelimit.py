"""Per-identity rate limiting: a client hammering the API is slowed, others are not.

Buckets live in Redis (REDIS_URL); each story uses fresh emails so it starts
with full buckets. A tiny refill rate makes the counts exact.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from django.conf import settings
from django.test import Client, override_settings

from core.ratelimit import LEASE_S, RateLimiter, get_rate_limiter
from tests.api.auth.conftest import SERVICE
from xmc.auth.tokens import issue_token

NEVER_REFILLS = 0.001  # tokens per second: one every ~17 minutes


@pytest.fixture
def tight_limit(settings: Any) -> None:
    settings.XMC_RATE_LIMIT_PER_S = NEVER_REFILLS
    settings.XMC_RATE_LIMIT_BURST = 3


def test_it_limits_a_hammering_identity_while_another_is_still_served(fresh_email: Callable[[str], str]) -> None:
    limiter = RateLimiter(settings.REDIS_URL, rate_per_s=NEVER_REFILLS, burst=5)
    hammer, bystander = fresh_email("hammer"), fresh_email("bystander")

    decisions = [limiter.check(hammer) for _ in range(20)]

    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 15
    assert decisions[-1].retry_after_s > 60
    assert limiter.check(bystander).allowed


def test_it_refills_the_bucket_over_time(fresh_email: Callable[[str], str]) -> None:
    limiter = RateLimiter(settings.REDIS_URL, rate_per_s=10, burst=1)
    caller = fresh_email("patient")
    assert limiter.check(caller).allowed
    refused = limiter.check(caller)
    assert not refused.allowed
    assert 0 < refused.retry_after_s <= 0.1
    time.sleep(refused.retry_after_s + 0.01)  # as long as it said to wait
    assert limiter.check(caller).allowed


def test_it_shares_one_bucket_between_processes(fresh_email: Callable[[str], str]) -> None:
    # Two limiters with their own connection pools stand for two server processes.
    web, grpc_server = (RateLimiter(settings.REDIS_URL, rate_per_s=NEVER_REFILLS, burst=4) for _ in range(2))
    caller = fresh_email("everywhere")
    allowed = [limiter.check(caller).allowed for limiter in (web, grpc_server) * 4]
    assert allowed.count(True) == 4


def counted_redis_calls(limiter: RateLimiter, monkeypatch: Any) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    real_execute = limiter._client.execute_command

    def counting_execute(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_execute(*args, **kwargs)

    monkeypatch.setattr(limiter._client, "execute_command", counting_execute)
    return calls


def test_it_spends_a_lease_locally_a_round_trip_per_lease(fresh_email: Callable[[str], str], monkeypatch: Any) -> None:
    limiter = RateLimiter(settings.REDIS_URL, rate_per_s=100, burst=100)
    assert limiter.lease_size == 10  # the refill of 0.1 s, at most a tenth of the burst
    limiter.check(fresh_email("warm-up"))  # loads the script into Redis if needed
    calls = counted_redis_calls(limiter, monkeypatch)
    caller = fresh_email("cheap")
    assert all(limiter.check(caller).allowed for _ in range(20))
    assert len(calls) == 2
    assert {args[0] for args in calls} == {"EVALSHA"}


def test_it_lets_a_lease_lapse_unspent_after_lease_s(fresh_email: Callable[[str], str], monkeypatch: Any) -> None:
    limiter = RateLimiter(settings.REDIS_URL, rate_per_s=NEVER_REFILLS * 40_000, burst=40)  # 40/s: leases of 4
    assert limiter.lease_size == 4
    caller = fresh_email("lapsing")
    limiter.check(caller)  # takes a lease of 4 out of the bucket, spends 1
    calls = counted_redis_calls(limiter, monkeypatch)
    limiter.check(caller)
    assert calls == []  # spent from the lease
    time.sleep(LEASE_S + 0.05)
    limiter.check(caller)
    assert len(calls) == 1  # the 2 left had lapsed: back to the shared bucket


def test_it_never_lets_the_processes_together_past_the_bucket_with_leases(fresh_email: Callable[[str], str]) -> None:
    # Two limiters stand for two server processes; 40/s leases 4 tokens at a time.
    web, grpc_server = (RateLimiter(settings.REDIS_URL, rate_per_s=40, burst=40) for _ in range(2))
    caller = fresh_email("leased")
    started = time.monotonic()
    allowed = sum(limiter.check(caller).allowed for limiter in (web, grpc_server) * 60)
    refilled = (time.monotonic() - started) * 40
    assert allowed <= 40 + refilled + 1
    # Stricter by at most the lease the other process holds unspent.
    assert allowed >= 40 - web.lease_size


def test_it_lets_requests_through_and_logs_once_when_redis_is_down(caplog: Any) -> None:
    limiter = RateLimiter("redis://127.0.0.1:1/0", rate_per_s=NEVER_REFILLS, burst=1)
    with caplog.at_level(logging.WARNING, logger="core.ratelimit"):
        started = time.monotonic()
        decisions = [limiter.check("alice@example.com") for _ in range(200)]
        elapsed = time.monotonic() - started
    assert all(d.allowed and d.degraded for d in decisions)
    assert [r.message.split(":")[0] for r in caplog.records] == ["ratelimit.redis_unavailable"]
    assert elapsed < 1.0  # after the first failure it does not even try Redis


def test_it_can_be_switched_off() -> None:
    limiter = RateLimiter(settings.REDIS_URL, rate_per_s=0, burst=0)
    assert all(limiter.check("alice@example.com").allowed for _ in range(10))


def test_it_rebuilds_the_shared_limiter_when_settings_change(settings: Any) -> None:
    settings.XMC_RATE_LIMIT_BURST = 7
    assert get_rate_limiter().burst == 7
    settings.XMC_RATE_LIMIT_BURST = 8
    assert get_rate_limiter().burst == 8


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tight_limit")
def test_it_answers_resource_exhausted_over_grpc_to_the_hammering_identity_only(
    channel: grpc.Channel, fresh_email: Callable[[str], str]
) -> None:
    call = channel.unary_unary(f"/{SERVICE}/Get")
    hammer = [("authorization", f"Bearer {issue_token(fresh_email('hammer'))}")]
    bystander = [("authorization", f"Bearer {issue_token(fresh_email('bystander'))}")]

    for _ in range(3):
        call(b"", metadata=hammer, timeout=10)
    with pytest.raises(grpc.RpcError) as limited:
        call(b"", metadata=hammer, timeout=10)

    assert limited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit exceeded" in limited.value.details()
    trailers = dict(limited.value.trailing_metadata())
    assert int(trailers["retry-after-ms"]) > 60_000
    assert call(b"", metadata=bystander, timeout=10)


@pytest.mark.django_db
@pytest.mark.usefixtures("tight_limit")
def test_it_answers_429_over_rest_and_shares_the_budget_with_grpc(fresh_email: Callable[[str], str]) -> None:
    hammer, bystander = fresh_email("hammer"), fresh_email("bystander")
    get_rate_limiter().check(hammer)  # one call already spent over gRPC
    with override_settings(ROOT_URLCONF="tests.api.auth.drf_urls"):
        statuses = [
            Client().get("/whoami", HTTP_AUTHORIZATION=f"Bearer {issue_token(hammer)}").status_code for _ in range(4)
        ]
        limited = Client().get("/whoami", HTTP_AUTHORIZATION=f"Bearer {issue_token(hammer)}")
        served = Client().get("/whoami", HTTP_AUTHORIZATION=f"Bearer {issue_token(bystander)}")

    assert statuses == [200, 200, 429, 429]
    assert limited.status_code == 429
    assert int(limited["Retry-After"]) > 60
    assert served.status_code == 200
