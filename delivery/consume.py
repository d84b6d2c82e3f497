"""The worker side of every queue: claim, heartbeat, run, retry with backoff, or give up.

:func:`consume` is what a Celery task calls around its work. The table's
owner says, per exception, whether to retry and after how long
(``retry_in``), and what giving up means for the person who asked
(``give_up``: a dead letter, and the execution, operation or delivery moved
so the person sees it).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from delivery import leases

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retry:
    """Retry after ``countdown`` seconds, unless the task already retried ``max_retries`` times."""

    countdown: float
    max_retries: int


def is_control_flow(exc: BaseException) -> bool:
    """Celery's own Retry / Reject / Ignore: never a failure of the work."""
    return type(exc).__module__.startswith("celery.")


def consume(
    celery_task: Any,
    model: leases.Table | None,
    row_id: int | None,
    run: Callable[[], None],
    *,
    retry_in: Callable[[Exception, int], Retry | None],
    give_up: Callable[[Exception, int], None],
    finish: Callable[[], Any] | None = None,
) -> bool:
    """Run one row's work at most once in effect; False when this copy was dropped.

    ``row_id`` is the row the task stands for (None: no row, e.g. a message
    sent before the outbox: run and retried the same way, without a claim). A
    copy whose row is done or claimed by another live run returns at once.
    An exception for which ``retry_in(exc, retries)`` gives a :class:`Retry`
    is retried (a Celery retry keeps the task id, so the claim stays ours; it
    is extended past the countdown) while ``retries < max_retries``; any other
    exception, or the last try, calls ``give_up(exc, attempts)``. ``finish``
    runs after a successful run; the claim is released when the run ends.
    """
    token = leases.token_of(celery_task)
    held = model is not None and row_id is not None
    if held and not leases.claim(model, row_id, token):  # type: ignore[arg-type]
        log.info("delivery.duplicate_dropped", extra={"id": row_id, "task": celery_task.name})
        return False
    retries = int(getattr(celery_task.request, "retries", 0) or 0)
    try:
        with leases.heartbeat(model, row_id, token) if held else nullcontext():  # type: ignore[arg-type]
            run()
    except Exception as exc:
        if is_control_flow(exc):
            raise
        plan = retry_in(exc, retries)
        if plan is not None and retries < plan.max_retries:
            if held:  # our retry runs after the countdown: keep the claim until a lease past it
                leases.extend(model, row_id, token,  # type: ignore[arg-type]
                              seconds=plan.countdown + settings.XMC_OPERATION_LEASE_S)
            log.warning("delivery.retry", extra={"id": row_id, "task": celery_task.name, "error": str(exc),
                                                 "countdown": plan.countdown})
            raise celery_task.retry(exc=exc, countdown=plan.countdown, max_retries=plan.max_retries) from exc
        give_up(exc, retries + 1)
    else:
        if finish is not None:
            finish()
    if held:
        leases.release(model, row_id, token)  # type: ignore[arg-type]
    return True
