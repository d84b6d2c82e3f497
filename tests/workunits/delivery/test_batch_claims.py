"""The batch form of the delivery floor's claim and worker side (``delivery.leases.claim_many``,
``delivery.consume.consume_many``): one statement claims a batch by the same rules as one row; a
batch is kept alive, retried and given up by the same path as one row (``consume``'s)."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from delivery import leases
from delivery.consume import Claim, Retry, consume_many
from tests.waiting import eventually
from tests.workunits.delivery.test_messages import FakeTask, Retry as Retried, message
from workunits.models import OutboxMessage


def rows(n: int) -> list[int]:
    return [message().id for _ in range(n)]


@pytest.mark.django_db(transaction=True)
def test_it_claims_many_rows_in_one_statement_taking_only_unclaimed_or_own_rows() -> None:
    done, other_live, other_expired, ours, unclaimed, locked = rows(6)
    now = timezone.now()
    OutboxMessage.objects.filter(id=done).update(done=True)
    OutboxMessage.objects.filter(id=other_live).update(claimed_by="other", claimed_until=now + timedelta(minutes=1))
    OutboxMessage.objects.filter(id=other_expired).update(claimed_by="other", claimed_until=now - timedelta(seconds=1))
    OutboxMessage.objects.filter(id=ours).update(claimed_by="me", claimed_until=now + timedelta(minutes=1))
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as other_transaction:
        other_transaction.execute("SELECT id FROM workunits_outboxmessage WHERE id = %s FOR UPDATE", [locked])
        with CaptureQueriesContext(connection) as queries:
            claimed = leases.claim_many(OutboxMessage, [locked, unclaimed, ours, other_expired, other_live, done,
                                                        10**9], "me", seconds=30)
    assert claimed == [other_expired, ours, unclaimed]  # the locked row is skipped, not waited for
    statements = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 1 and statements[0].startswith("UPDATE") and "RETURNING" in statements[0]
    taken = OutboxMessage.objects.filter(id__in=claimed)
    assert {r.claimed_by for r in taken} == {"me"}
    assert all(r.claimed_until > timezone.now() + timedelta(seconds=25) for r in taken)
    assert OutboxMessage.objects.get(id=other_live).claimed_by == "other"
    assert OutboxMessage.objects.get(id=locked).claimed_until is None
    assert leases.claim_many(OutboxMessage, [locked], "me") == [locked]  # the lock is gone: taken


@pytest.mark.django_db(transaction=True)
def test_it_keeps_a_batchs_claims_alive_by_heartbeat_but_not_one_released_while_the_rest_still_runs() -> None:
    settled, running, also_running = rows(3)
    ids = leases.claim_many(OutboxMessage, [settled, running, also_running], "me", seconds=0.6)
    first = OutboxMessage.objects.get(id=running).claimed_until
    with leases.heartbeat(OutboxMessage, ids, "me", seconds=0.6):  # extends every 0.2 s
        leases.release_many(OutboxMessage, [settled], "me")  # settled: its own next task must not be dropped
        eventually(lambda: OutboxMessage.objects.get(id=running).claimed_until > first, timeout=10,
                   what="the heartbeat extending the claims")
    assert OutboxMessage.objects.get(id=settled).claimed_until is None
    assert OutboxMessage.objects.get(id=also_running).claimed_until > first


@pytest.mark.django_db
def test_it_retries_a_batch_by_the_tables_policy_with_its_claims_pushed_past_the_countdown_then_gives_up_and_releases(
        ) -> None:
    batch = rows(3)
    assert leases.claim_many(OutboxMessage, [batch[2]], "other-run", seconds=60) == [batch[2]]
    given_up: list[tuple[str, int]] = []
    ran: list[Claim] = []

    def fails(claim: Claim) -> None:
        ran.append(claim)
        raise DatabaseError("connection lost")

    def policy(exc: Exception, retries: int) -> Retry | None:
        return Retry(30.0, 2) if isinstance(exc, DatabaseError) else None

    options: dict[str, Any] = {"retry_in": policy, "give_up": lambda exc, n: given_up.append((str(exc), n))}
    task = FakeTask(id="t")
    with pytest.raises(Retried):
        consume_many(task, OutboxMessage, batch, fails, **options)
    assert ran == [Claim(batch[:2], "t")] and task.retried == [30.0]  # the held row was dropped
    held = OutboxMessage.objects.filter(id__in=batch[:2])
    assert all(r.claimed_by == "t" and r.claimed_until > timezone.now() + timedelta(seconds=30) for r in held)
    assert leases.claim_many(OutboxMessage, batch, "a-copy") == []  # nobody else takes them meanwhile
    task.retries = 2  # the last try: the same task id takes its rows again, fails, gives up
    assert consume_many(task, OutboxMessage, batch, fails, **options) == Claim(batch[:2], "t")
    assert given_up == [("connection lost", 3)]
    assert all(r.claimed_until is None and not r.done for r in OutboxMessage.objects.filter(id__in=batch[:2]))
