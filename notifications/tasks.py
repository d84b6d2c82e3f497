"""Celery tasks of the ``notifications`` queue: thin adapters around ``notifications.services``.

* ``xmc.notifications.fan_out(event_ids)``: give events to their subscriptions;
* ``xmc.notifications.deliver(delivery_id | [delivery_id, ...])``: claim, send and record messages;
* ``xmc.notifications.sweep()`` (beat): scan for work units queued too long,
  for experiments that finished without a transition saying so, and for
  degraded delivery. Stranded events and deliveries whose message was lost or
  whose lease ran out are sent again by the one delivery sweep
  (``delivery.tasks.sweep``, which ``notifications.apps`` registers them with).

``fan_out`` and ``deliver`` stand for rows (``Event``, ``Delivery``) and run
through the delivery floor's one worker-side wrapper,
``delivery.consume.consume_many``: the batch is claimed in one statement (a
copy whose rows another live run holds is dropped), kept alive by the
heartbeat, a database error retried with ``delivery.backoff.jittered``
(:func:`database_errors`), and giving up leaves the rows due for the sweep
(:func:`left_for_the_sweep`). All idempotent: the database decides (unique
rows, row-locked claims), so a redelivered or duplicated message changes
nothing.
"""
from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from core.queues import Queue
from delivery import backoff, declare, leases
from delivery.consume import Claim, Retry, consume_many
from notifications import outbox, services, sources
from notifications.models import Delivery, Event

log = logging.getLogger(__name__)

FAN_OUT_TASK = outbox.FAN_OUT_TASK
DELIVER_TASK = outbox.DELIVER_TASK
SWEEP_TASK = outbox.SWEEP_TASK

#: Retries of a database error, and the cap of their backoff (seconds).
DB_MAX_RETRIES = 20
DB_BACKOFF_MAX_S = 60.0

OPTIONS: dict[str, Any] = {"bind": True, "queue": Queue.NOTIFICATIONS, "time_limit": 60}


def database_errors(exc: Exception, retries: int) -> Retry | None:
    """A database error is retried (``delivery.backoff.jittered``: 1 s doubling to a minute, at most
    ``DB_MAX_RETRIES`` times); anything else is not (a retry would fail the same way)."""
    if isinstance(exc, DatabaseError):
        return Retry(backoff.jittered(retries, base=1.0, cap=DB_BACKOFF_MAX_S), DB_MAX_RETRIES)
    return None


def left_for_the_sweep(exc: Exception, attempts: int) -> None:
    """Giving up a batch: its rows stay not done and their claims are released, so the one delivery
    sweep sends them again (a delivery's own tries still end in DEAD and a dead letter, by
    ``XMC_NOTIFY_MAX_ATTEMPTS``, ``notifications.sending._record_failed``)."""
    log.error("notifications.gave_up", extra={"attempts": attempts, "error": f"{type(exc).__name__}: {exc}"},
              exc_info=exc)


@declare.task(name=FAN_OUT_TASK, **OPTIONS)
def fan_out(self: Any, event_ids: list[int]) -> None:
    ids = [int(i) for i in event_ids]
    claim = consume_many(self, Event, ids, _fan_out, retry_in=database_errors, give_up=left_for_the_sweep)
    # An event row-locked when the task came (the publisher recording that the broker took it) is
    # looked at again in a second, as a delivery is, not left to the sweep.
    outbox.enqueue_fan_out(leases.locked_out(Event, sorted(set(ids) - set(claim.ids)), claim.token),
                           countdown=leases.LOCKED_RETRY_S)


def _fan_out(claim: Claim) -> None:
    services.fan_out_many(claim.ids)


@declare.task(name=DELIVER_TASK, **OPTIONS)
def deliver(self: Any, delivery_id: int | list[int]) -> str:
    """One delivery, or a batch of them (``services.enqueue`` sends the due ones of a fan-out together)."""
    ids = [int(i) for i in delivery_id] if isinstance(delivery_id, list) else [int(delivery_id)]
    outcomes: dict[int, services.Outcome] = {}

    def run(claim: Claim) -> None:
        outcomes.update(services.deliver_many(claim.ids, token=claim.token))

    claim = consume_many(self, Delivery, ids, run, retry_in=database_errors, give_up=left_for_the_sweep,
                         seconds=settings.XMC_NOTIFY_LEASE_S)
    outcomes.update(services.not_claimed(set(ids) - set(claim.ids), token=claim.token))
    for did, outcome in sorted(outcomes.items()):
        log.info("notifications.deliver", extra={"delivery": did, "action": outcome.action})
        if outcome.action in ("not_due", "leased") and outcome.retry_in is not None:
            outbox.enqueue([did], countdown=outcome.retry_in + 0.5)  # the sweep is the safety net
    return ",".join(sorted({o.action for o in outcomes.values()}))


@declare.task(name=SWEEP_TASK, **OPTIONS, retry_for=(DatabaseError,), backoff_max=DB_BACKOFF_MAX_S,
              max_retries=DB_MAX_RETRIES)
def sweep(self: Any) -> None:
    outbox.enqueue_fan_out(sources.scan_queued_too_long())
    outbox.enqueue_fan_out(sources.scan_finished())
    outbox.enqueue_fan_out(sources.scan_delivery_degraded())
