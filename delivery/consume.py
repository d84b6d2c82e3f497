"""The worker side of every queue: claim, heartbeat, run, retry with backoff, or give up.

:func:`consume` is what a Celery task that stands for one row calls around
its work; :func:`consume_many` what a task that stands for a batch of rows
calls (the notifications' fan-out and deliveries): the batch is claimed in
one statement (``delivery.leases.claim_many``), and the run gets the rows
it holds. The table's owner says, per exception, whether to retry and after
how long (``retry_in``), and what giving up means for the person who asked
(``give_up``: a dead letter, and the execution, operation or delivery moved
so the person sees it; or the rows left due for the sweep). Both share one
run-retry-or-give-up path (:func:`_run_held`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q

from delivery import leases

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retry:
    """Retry after ``countdown`` seconds, unless the task already retried ``max_retries`` times."""

    countdown: float
    max_retries: int


@dataclass(frozen=True)
class Claim:
    """The rows a run holds (sorted ids) and the token it holds them under (``claimed_by``)."""

    ids: list[int]
    token: str


RetryIn = Callable[[Exception, int], Retry | None]
GiveUp = Callable[[Exception, int], None]


def is_control_flow(exc: BaseException) -> bool:
    """Celery's own Retry / Reject / Ignore: never a failure of the work."""
    return type(exc).__module__.startswith("celery.")


@dataclass(frozen=True)
class _Held:
    """What a run keeps while it works: its claim of rows of one table (none for a run without rows)."""

    model: leases.Table | None
    claim: Claim
    seconds: float | None = None  # the lease (``XMC_OPERATION_LEASE_S`` by default)

    def alive(self) -> AbstractContextManager[None]:
        """The heartbeat while the run works."""
        if self.model is None or not self.claim.ids:
            return nullcontext()
        return leases.heartbeat(self.model, self.claim.ids, self.claim.token, seconds=self.seconds)

    def extend(self, countdown: float) -> None:
        """Our retry runs after ``countdown``: keep the claim until a lease past it."""
        if self.model is not None and self.claim.ids:
            lease = self.seconds if self.seconds is not None else settings.XMC_OPERATION_LEASE_S
            leases.extend_many(self.model, self.claim.ids, self.claim.token, seconds=countdown + lease)

    def release(self) -> None:
        if self.model is not None and self.claim.ids:
            leases.release_many(self.model, self.claim.ids, self.claim.token)


def _run_held(celery_task: Any, held: _Held, run: Callable[[], None], *, retry_in: RetryIn, give_up: GiveUp,
              finish: Callable[[], Any] | None = None) -> None:
    """The one run-retry-or-give-up path of :func:`consume` and :func:`consume_many`.

    An exception for which ``retry_in(exc, retries)`` gives a :class:`Retry`
    is retried (a Celery retry keeps the task id, so the claim stays ours; it
    is extended past the countdown) while ``retries < max_retries``; any other
    exception, or the last try, calls ``give_up(exc, attempts)``. ``finish``
    runs after a successful run; the claim is released when the run ends.
    """
    retries = int(getattr(celery_task.request, "retries", 0) or 0)
    try:
        with held.alive():
            run()
    except Exception as exc:
        if is_control_flow(exc):
            raise
        plan = retry_in(exc, retries)
        if plan is not None and retries < plan.max_retries:
            held.extend(plan.countdown)
            log.warning("delivery.retry", extra={"ids": held.claim.ids[:20], "task": celery_task.name,
                                                 "error": str(exc), "countdown": plan.countdown})
            raise celery_task.retry(exc=exc, countdown=plan.countdown, max_retries=plan.max_retries) from exc
        give_up(exc, retries + 1)
    else:
        if finish is not None:
            finish()
    held.release()


def consume(
    celery_task: Any,
    model: leases.Table | None,
    row_id: int | None,
    run: Callable[[], None],
    *,
    retry_in: RetryIn,
    give_up: GiveUp,
    finish: Callable[[], Any] | None = None,
) -> bool:
    """Run one row's work at most once in effect; False when this copy was dropped.

    ``row_id`` is the row the task stands for (None: no row, e.g. a message
    sent before the outbox: run and retried the same way, without a claim). A
    copy whose row is done or claimed by another live run returns at once.
    Retries, giving up and ``finish``: :func:`_run_held`.
    """
    token = leases.token_of(celery_task)
    if model is not None and row_id is not None:
        if not leases.claim(model, row_id, token):
            log.info("delivery.duplicate_dropped", extra={"id": row_id, "task": celery_task.name})
            return False
        held = _Held(model, Claim([row_id], token))
    else:
        held = _Held(None, Claim([], token))
    _run_held(celery_task, held, run, retry_in=retry_in, give_up=give_up, finish=finish)
    return True


def consume_many(
    celery_task: Any,
    model: leases.Table,
    ids: Sequence[int],
    run: Callable[[Claim], None],
    *,
    retry_in: RetryIn,
    give_up: GiveUp,
    seconds: float | None = None,
    extra: Q | None = None,
) -> Claim:
    """Run a batch of rows' work at most once in effect; the claim the run got (empty: all dropped).

    The batch is claimed in one statement (``delivery.leases.claim_many``:
    not done, unclaimed or ours, the table's ``extra`` filter; a row another
    transaction holds locked right now is skipped); the rows done or held by
    another live run are dropped, and ``run`` gets the rest with the token it
    holds them under. ``seconds`` is the table's lease (the heartbeat extends
    it every third). Retries and giving up: :func:`_run_held`, the same as
    :func:`consume`; a retry runs again over the whole batch (its args), and
    takes again what is still not done.
    """
    token = leases.token_of(celery_task)
    claim = Claim(leases.claim_many(model, ids, token, seconds=seconds, extra=extra), token)
    if len(claim.ids) < len(set(ids)):
        log.info("delivery.duplicate_dropped", extra={"ids": sorted(set(map(int, ids)) - set(claim.ids))[:20],
                                                      "task": celery_task.name})
    if claim.ids:
        _run_held(celery_task, _Held(model, claim, seconds), lambda: run(claim), retry_in=retry_in,
                  give_up=give_up)
    return claim
