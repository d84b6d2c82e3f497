"""Celery tasks of the ``notifications`` queue: thin adapters around ``notifications.services``.

* ``xmc.notifications.fan_out(event_ids)``: give events to their subscriptions;
* ``xmc.notifications.deliver(delivery_id | [delivery_id, ...])``: claim, send and record messages;
* ``xmc.notifications.sweep()`` (beat): scan for work units queued too long,
  for experiments that finished without a transition saying so, and for
  degraded delivery. Stranded events and deliveries whose message was lost or
  whose lease ran out are sent again by the one delivery sweep
  (``delivery.tasks.sweep``, which ``notifications.apps`` registers them with).

All idempotent: the database decides (unique rows, row-locked claims), so a
redelivered or duplicated message changes nothing.
"""
from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError

from core.queues import Queue
from delivery import declare
from notifications import outbox, services, sources

log = logging.getLogger(__name__)

FAN_OUT_TASK = outbox.FAN_OUT_TASK
DELIVER_TASK = outbox.DELIVER_TASK
SWEEP_TASK = outbox.SWEEP_TASK

OPTIONS: dict[str, Any] = {
    "bind": True, "queue": Queue.NOTIFICATIONS,
    "retry_for": (DatabaseError,), "backoff_max": 60, "max_retries": 20, "time_limit": 60,
}


@declare.task(name=FAN_OUT_TASK, **OPTIONS)
def fan_out(self: Any, event_ids: list[int]) -> None:
    services.fan_out_many([int(i) for i in event_ids])


@declare.task(name=DELIVER_TASK, **OPTIONS)
def deliver(self: Any, delivery_id: int | list[int]) -> str:
    """One delivery, or a batch of them (``services.enqueue`` sends the due ones of a fan-out together)."""
    ids = [int(i) for i in delivery_id] if isinstance(delivery_id, list) else [int(delivery_id)]
    outcomes = services.deliver_many(ids)
    for did, outcome in sorted(outcomes.items()):
        log.info("notifications.deliver", extra={"delivery": did, "action": outcome.action})
        if outcome.action in ("not_due", "leased") and outcome.retry_in is not None:
            outbox.enqueue([did], countdown=outcome.retry_in + 0.5)  # the sweep is the safety net
    return ",".join(sorted({o.action for o in outcomes.values()}))


@declare.task(name=SWEEP_TASK, **OPTIONS)
def sweep(self: Any) -> None:
    outbox.enqueue_fan_out(sources.scan_queued_too_long())
    outbox.enqueue_fan_out(sources.scan_finished())
    outbox.enqueue_fan_out(sources.scan_delivery_degraded())
