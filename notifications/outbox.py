"""The notifications queue's side of the delivery floor: what is published, and what the one sweep re-sends.

Every message of the queue stands for a row (an ``Event`` to fan out, a
``Delivery`` to send), both ``delivery.models.Leased``: published through
``delivery.broker`` (stamping ``dispatched_time``), re-sent by
``delivery.sweep`` (``sweep_events``, ``sweep_deliveries``, registered in
``notifications.apps``) while not done and no live claim holds them.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.queues import Queue
from delivery import broker, leases
from notifications.models import Delivery, DeliveryStatus, Event

log = logging.getLogger(__name__)


#: The longest countdown a deliver task is sent with (well under XMC_CELERY_VISIBILITY_TIMEOUT_S).
MAX_COUNTDOWN_S = 600.0


#: Task names of the notifications queue (notifications.tasks registers them).
FAN_OUT_TASK = "xmc.notifications.fan_out"
DELIVER_TASK = "xmc.notifications.deliver"
SWEEP_TASK = "xmc.notifications.sweep"

#: What a delivery's dead letter names as its source (``workunits.models.DeadLetter.source``); the
#: admin's "send again" of it is ``subscriptions.send_again`` (registered in ``notifications.apps``).
DEAD_LETTER_SOURCE = "notifications.delivery"


def after_commit(callback: Any) -> None:
    """Run ``callback`` once the current transaction commits (the enqueueing of tasks)."""
    transaction.on_commit(callback)


#: Deliveries one ``deliver`` task carries (enqueue batches those that are due together).
DELIVER_BATCH = 50


def enqueue(delivery_ids: Sequence[int], countdown: float | None = None) -> None:
    """Hand deliveries to the ``notifications`` queue; a broker outage loses nothing (the sweep resends)."""
    if countdown:
        # Never past the broker's visibility timeout (Redis would hand the waiting message out
        # again): a long wait (quiet hours) is a chain of hops, each task re-checking the row.
        countdown = min(max(0.0, countdown), MAX_COUNTDOWN_S)
    ids = list(delivery_ids)
    for start in range(0, len(ids), DELIVER_BATCH):  # one task per batch: claimed and recorded together
        chunk = ids[start:start + DELIVER_BATCH]
        try:
            broker.publish(DELIVER_TASK, [chunk[0] if len(chunk) == 1 else chunk], queue=Queue.NOTIFICATIONS.value,
                           countdown=countdown)
        except Exception:
            log.warning("notifications.enqueue_failed", extra={"deliveries": chunk}, exc_info=True)
            continue
        leases.mark_sent(Delivery, chunk)


def enqueue_fan_out(event_ids: Sequence[int], countdown: float | None = None) -> None:
    """Hand events to the fan-out task; one the broker did not take stays due (``sweep_events``)."""
    if not event_ids:
        return
    try:
        broker.publish(FAN_OUT_TASK, [list(event_ids)], queue=Queue.NOTIFICATIONS.value, countdown=countdown)
    except Exception:
        log.warning("notifications.fan_out_enqueue_failed", extra={"events": len(event_ids)}, exc_info=True)
        return
    leases.mark_sent(Event, list(event_ids))


def due_deliveries(now: datetime, limit: int = 500) -> list[int]:
    """Deliveries the sweep sends again: not done, due, and no live claim (PENDING ones whose
    message was lost, DELIVERING ones whose worker died: ``delivery.leases.unclaimed``)."""
    grace = now - timedelta(seconds=5)  # leave the just-enqueued ones to their task
    waiting = Q(next_attempt_time__lte=grace, not_before__lte=grace)
    stranded = Q(status=DeliveryStatus.DELIVERING)  # unclaimed: its worker's lease ran out
    rows = Delivery.objects.filter(leases.unclaimed(now), done=False).filter(waiting | stranded)
    return list(rows.order_by("id").values_list("id", flat=True)[:limit])


def stranded_events(now: datetime, limit: int = 500) -> list[int]:
    """Events whose fan-out never ran (the broker was down when they were recorded, or the message
    was lost): ``delivery.leases.due`` on the events table."""
    rows = Event.objects.filter(done=False).filter(leases.due(now))
    return list(rows.order_by("id").values_list("id", flat=True)[:limit])


def sweep_deliveries() -> int:
    """``delivery.sweep``'s re-sender of this table: the due deliveries, again."""
    ids = due_deliveries(timezone.now())
    enqueue(ids)
    return len(ids)


def sweep_events() -> int:
    """``delivery.sweep``'s re-sender of the events table: the fan-outs that never ran, again."""
    ids = stranded_events(timezone.now())
    enqueue_fan_out(ids)
    return len(ids)
