"""Notification services: the one import for views, tasks, the admin and the pages.

The work is split along its seams (docs/architecture/notifications.md):

* ``notifications.subscriptions``: subscriptions for their owner (CRUD,
  rotation, a test message, "send again");
* ``notifications.fanout``: events recorded once and given to every matching
  subscription once (one message per recipient and event);
* ``notifications.sending``: claim, send and record deliveries (backoff, dead
  letters, circuit breakers, quiet hours, rate limits);
* ``notifications.outbox``: what the queue publishes and the one sweep re-sends;
* ``notifications.channels``: webhook, Slack and email adapters.
"""
from __future__ import annotations

from notifications.fanout import (
    COALESCED,
    FAN_OUT_CHUNK,
    fan_out,
    fan_out_many,
    happened_at,
    may_read,
    recipient_of,
    record_events,
    subscriber_identity,
)
from notifications.outbox import (
    DELIVER_BATCH,
    DELIVER_TASK,
    FAN_OUT_TASK,
    MAX_COUNTDOWN_S,
    SWEEP_TASK,
    due_deliveries,
    enqueue,
    enqueue_fan_out,
    stranded_events,
    sweep_deliveries,
    sweep_events,
)
from notifications.sending import Outcome, backoff_s, deliver, deliver_many, not_claimed
from notifications.subscriptions import (
    ALLOWED_FIELDS,
    DELIVERY_LOG,
    EXPERIMENT_EVENTS,
    MAX_SUBSCRIPTIONS_PER_OWNER,
    ROTATION_OVERLAP,
    STAFF_EVENTS,
    SUBSCRIBABLE,
    Created,
    create,
    delete,
    deliveries,
    get,
    last_deliveries,
    list_for,
    overlap_note,
    redacted,
    resend,
    rotate_secret,
    send_again,
    send_test,
    update,
)

__all__ = [
    "ALLOWED_FIELDS", "COALESCED", "DELIVERY_LOG", "DELIVER_BATCH", "DELIVER_TASK", "EXPERIMENT_EVENTS",
    "FAN_OUT_CHUNK", "FAN_OUT_TASK", "MAX_COUNTDOWN_S", "MAX_SUBSCRIPTIONS_PER_OWNER", "ROTATION_OVERLAP",
    "STAFF_EVENTS", "SUBSCRIBABLE", "SWEEP_TASK", "Created", "Outcome", "backoff_s", "create", "delete",
    "deliver", "deliver_many", "deliveries", "due_deliveries", "enqueue", "enqueue_fan_out", "fan_out",
    "fan_out_many", "get", "happened_at", "last_deliveries", "list_for", "may_read", "not_claimed", "overlap_note",
    "recipient_of", "record_events", "redacted", "resend", "rotate_secret", "send_again", "send_test",
    "stranded_events", "subscriber_identity", "sweep_deliveries", "sweep_events", "update",
]
