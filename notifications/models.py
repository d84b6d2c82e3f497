"""Notification models: who wants to hear what (Subscription), what happened (Event),
the outbox of messages to send (Delivery, one per subscription and coalescing window),
which events each message carries (DeliveryEvent: one row per event and subscription,
unique, so an event reaches a subscription at most once), every try (DeliveryAttempt)
and the per-subscription circuit breaker (EndpointHealth).

docs/architecture/notifications.md describes the whole mechanism.
"""
from __future__ import annotations

import uuid

from django.db import models

from delivery.models import Leased


class EventType(models.TextChoices):
    WORK_UNIT_FAILED = "WORK_UNIT_FAILED"
    EXPERIMENT_FINISHED = "EXPERIMENT_FINISHED"
    WORK_UNIT_QUEUED_TOO_LONG = "WORK_UNIT_QUEUED_TOO_LONG"
    #: A running execution's GPUs stayed idle (the system metrics' advisory, ``sources.on_advisories``).
    WORK_UNIT_IDLE = "WORK_UNIT_IDLE"
    SCHEDULING_PAUSED = "SCHEDULING_PAUSED"
    SCHEDULING_RESUMED = "SCHEDULING_RESUMED"
    #: Staff: work has waited for a worker past XMC_DEGRADED_AFTER_S (``sources.scan_delivery_degraded``).
    OPERATOR_DELIVERY_DEGRADED = "OPERATOR_DELIVERY_DEGRADED"
    TEST = "TEST"


#: The ``type`` of the webhook payload for each event type.
PAYLOAD_TYPE = {
    EventType.WORK_UNIT_FAILED: "workUnit.failed",
    EventType.EXPERIMENT_FINISHED: "experiment.finished",
    EventType.WORK_UNIT_QUEUED_TOO_LONG: "workUnit.queuedTooLong",
    EventType.WORK_UNIT_IDLE: "workUnit.idle",
    EventType.SCHEDULING_PAUSED: "scheduling.paused",
    EventType.SCHEDULING_RESUMED: "scheduling.resumed",
    EventType.OPERATOR_DELIVERY_DEGRADED: "operator.deliveryDegraded",
    EventType.TEST: "test",
}


class Scope(models.TextChoices):
    EXPERIMENT = "EXPERIMENT"  # one experiment
    MINE = "MINE"  # every experiment the subscriber created
    FILTER = "FILTER"  # an AIP-160 filter over experiments
    NONE = "NONE"  # staff events only (scheduling paused/resumed)


class Channel(models.TextChoices):
    WEBHOOK = "WEBHOOK"
    SLACK = "SLACK"
    EMAIL = "EMAIL"


class Subscription(models.Model):
    owner = models.CharField(max_length=320, db_index=True, help_text="Verified email of the subscriber.")
    #: Staff may subscribe a Django group: the group (as an ACL principal) must read the
    #: experiment, and an email goes to every active member.
    group = models.CharField(max_length=150, blank=True, default="")
    scope = models.CharField(max_length=16, choices=Scope.choices)
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, null=True, blank=True,
                                   related_name="+")
    filter = models.TextField(blank=True, default="", help_text="AIP-160 filter over experiments (scope FILTER).")
    events = models.JSONField(default=list, help_text="EventType names.")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    url = models.CharField(max_length=2048, blank=True, default="",
                           help_text="Webhook URL; for Slack only a redacted form (the URL is the secret).")
    #: Fernet-encrypted Slack incoming-webhook URL (whoever holds it may post to the channel).
    url_encrypted = models.TextField(blank=True, default="")
    email = models.CharField(max_length=320, blank=True, default="", help_text="Email address (default: the owner).")
    #: Fernet-encrypted ``whsec_...`` (webhook channel); never returned after creation.
    secret_encrypted = models.TextField(blank=True, default="")
    #: The secret before the last rotation, still signing until ``previous_secret_expires``.
    previous_secret_encrypted = models.TextField(blank=True, default="")
    previous_secret_expires = models.DateTimeField(null=True, blank=True)
    queued_minutes = models.IntegerField(default=30, help_text="WORK_UNIT_QUEUED_TOO_LONG threshold.")
    rate_limit_per_hour = models.IntegerField(default=60)
    quiet_start = models.TimeField(null=True, blank=True, help_text="Quiet hours start (UTC).")
    quiet_end = models.TimeField(null=True, blank=True, help_text="Quiet hours end (UTC).")
    enabled = models.BooleanField(default=True)
    create_time = models.DateTimeField()
    update_time = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"subscriptions/{self.id} ({self.owner}, {self.channel})"


class Event(Leased):
    """A fact worth telling, written once per ``key`` (idempotent: ON CONFLICT DO NOTHING).

    The outbox row of its fan-out (``delivery.models.Leased``): ``done`` once
    it was given to its subscriptions; sent again by ``delivery.sweep`` while not.
    """

    key = models.CharField(max_length=200, unique=True)
    type = models.CharField(max_length=32, choices=EventType.choices)
    xid = models.BigIntegerField(null=True, blank=True, db_index=True)
    wid = models.BigIntegerField(null=True, blank=True)
    eid = models.BigIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict)
    create_time = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["done", "create_time"], name="notif_event_pending")]

    def __str__(self) -> str:
        return self.key


class DeliveryStatus(models.TextChoices):
    PENDING = "PENDING"
    DELIVERING = "DELIVERING"
    DELIVERED = "DELIVERED"
    DEAD = "DEAD"  # the dead letter: every try failed
    SUPPRESSED = "SUPPRESSED"  # not sent: the subscriber may not read the experiment, or it is disabled


def _message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


class Delivery(Leased):
    """One message to one subscription: the outbox row. ``message_id`` is the ``webhook-id`` of every try.

    Its lease columns are ``delivery.models.Leased``'s: ``done`` once DELIVERED,
    DEAD or SUPPRESSED; ``claimed_until`` while a worker sends it (DELIVERING).
    """

    message_id = models.CharField(max_length=64, unique=True, default=_message_id)
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    type = models.CharField(max_length=32, choices=EventType.choices)
    xid = models.BigIntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.IntegerField(default=0)
    #: Coalescing: events of the same experiment join this message until then.
    not_before = models.DateTimeField()
    next_attempt_time = models.DateTimeField()
    #: A group's email: the members' addresses that hear of its events through another
    #: subscription's message, decided at fan-out and left out when it is sent (one email per
    #: person and event however many groups reach them).
    left_out = models.JSONField(default=list, blank=True)
    #: The body, frozen at the first try so every retry sends the same bytes.
    body = models.TextField(blank=True, default="")
    timestamp = models.BigIntegerField(null=True, blank=True, help_text="webhook-timestamp of the first try.")
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    create_time = models.DateTimeField()
    delivered_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["status", "next_attempt_time"], name="notif_delivery_due"),
            models.Index(fields=["subscription", "xid", "type", "status"], name="notif_delivery_open"),
        ]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.message_id} ({self.status})"


class DeliveryEvent(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="items")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="+")
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["event", "subscription"], name="notif_one_per_event_sub")]


class DeliveryAttempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.IntegerField()
    time = models.DateTimeField()
    latency_ms = models.IntegerField(default=0)
    status_code = models.IntegerField(null=True, blank=True)
    ok = models.BooleanField(default=False)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["id"]


class EndpointHealth(models.Model):
    """The circuit breaker of one subscription: ``endpoint`` is ``notifications.channels.breaker_key``
    (``subscriptions/{id}``), so one subscriber's failures never hold back another's."""

    endpoint = models.CharField(max_length=512, unique=True)
    consecutive_failures = models.IntegerField(default=0)
    open_until = models.DateTimeField(null=True, blank=True)
    update_time = models.DateTimeField()

    def __str__(self) -> str:
        return self.endpoint
