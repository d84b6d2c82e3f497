"""Subscriptions: create, read, change, rotate, delete for their owner; a test message; send again.

Every write is one transaction; the messages it queues are published after
it commits (``notifications.outbox.after_commit``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import time as dtime
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from core.queues import Queue
from experiments import acl
from experiments.acl import Role
from experiments.models import Experiment
from notifications import crypto, outbox, signing, ssrf
from notifications.models import (
    Channel,
    Delivery,
    DeliveryEvent,
    DeliveryStatus,
    Event,
    EventType,
    Scope,
    Subscription,
)
from workunits import services as wu_services
from xmc import listing
from xmc.api.handlers import EXPERIMENT_FIELDS
from xmc.auth.identity import Identity, validated_email
from xmc.listing.errors import ListingError
from core.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, ServiceError

log = logging.getLogger(__name__)


#: Event types that concern one experiment (the others are for staff: the scheduling switch).
EXPERIMENT_EVENTS = frozenset({EventType.WORK_UNIT_FAILED, EventType.EXPERIMENT_FINISHED,
                               EventType.WORK_UNIT_QUEUED_TOO_LONG, EventType.WORK_UNIT_IDLE})
STAFF_EVENTS = frozenset({EventType.SCHEDULING_PAUSED, EventType.SCHEDULING_RESUMED,
                          EventType.OPERATOR_DELIVERY_DEGRADED})


SUBSCRIBABLE = sorted((EXPERIMENT_EVENTS | STAFF_EVENTS))
ROTATION_OVERLAP = timedelta(hours=24)


def overlap_note(sub: Subscription, now: datetime | None = None) -> str:
    """What a rotation's answer says (REST and the page): until when the previous secret signs.
    Empty when no previous secret signs any more."""
    until = sub.previous_secret_expires
    if not sub.previous_secret_encrypted or until is None or until <= (now or timezone.now()):
        return ""
    hours = int(ROTATION_OVERLAP.total_seconds() // 3600)
    return (f"The previous secret keeps signing beside the new one until {until:%Y-%m-%d %H:%M} UTC "
            f"({hours} h after the rotation): every request carries both signatures until then. "
            "Switch your receiver to the new secret before that time.")


MAX_SUBSCRIPTIONS_PER_OWNER = 100


# --- Subscriptions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Created:
    subscription: Subscription
    #: The webhook secret in clear: returned only by create and rotate, never stored in clear.
    secret: str | None


def _owned(identity: Identity, sid: int) -> Subscription:
    sub = Subscription.objects.filter(id=sid).first()
    if sub is None or sub.owner != identity.email:
        # The same answer for "missing" and "someone else's": a stranger learns nothing.
        raise NotFound(f"subscriptions/{sid} not found", field="name")
    return sub


def get(identity: Identity, sid: int) -> Subscription:
    return _owned(identity, sid)


def list_for(identity: Identity) -> list[Subscription]:
    return list(Subscription.objects.filter(owner=identity.email).order_by("id"))


#: The delivery log shows (and GET /v1/subscriptions/{id}/deliveries answers) the newest this many messages.
DELIVERY_LOG = 100


def deliveries(identity: Identity, sid: int, limit: int = DELIVERY_LOG) -> list[Delivery]:
    """The delivery log of one of the caller's subscriptions, newest first, with every try prefetched."""
    sub = _owned(identity, sid)
    return list(sub.deliveries.prefetch_related("attempt_log").order_by("-id")[:limit])


def last_deliveries(subs: Sequence[Subscription]) -> dict[int, Delivery]:
    """The newest delivery of each subscription in ``subs`` (one query), by subscription id."""
    newest = Delivery.objects.filter(subscription=OuterRef("pk")).order_by("-id").values("id")[:1]
    ids = Subscription.objects.filter(id__in=[s.id for s in subs]).annotate(last=Subquery(newest)) \
        .values_list("last", flat=True)
    return {d.subscription_id: d for d in Delivery.objects.filter(id__in=[i for i in ids if i is not None])}


def _parse_experiment(value: Any, identity: Identity) -> Experiment:
    if not isinstance(value, str) or not value.startswith("experiments/"):
        raise InvalidArgument("experiment must be a name like experiments/12", field="experiment")
    tail = value[len("experiments/"):]
    if not (tail.isascii() and tail.isdigit()) or len(tail) > 18:
        raise InvalidArgument("experiment must be a name like experiments/12", field="experiment")
    exp = Experiment.objects.filter(id=int(tail)).first()
    # Permission first: the same answer whether or not it exists (staff: NOT_FOUND).
    if exp is None:
        if identity.is_staff:
            raise NotFound(f"{value} not found", field="experiment")
        raise PermissionDenied(f"{identity.email} may not read {value}", field="experiment")
    if acl.role_of(identity, exp.acls) < Role.READER:
        raise PermissionDenied(f"{identity.email} may not read {value}", field="experiment")
    return exp


def _parse_filter(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument("filter must be a non-empty AIP-160 filter over experiments", field="filter")
    if len(value) > 2000:
        raise InvalidArgument("filter is longer than 2000 characters", field="filter")
    try:
        listing.compile_filter(value, EXPERIMENT_FIELDS)
    except ListingError as exc:
        raise InvalidArgument(f"filter: {exc}", field="filter") from None
    return value


def _parse_time(value: Any, field: str) -> dtime | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a time like 22:00 (UTC)", field=field)
    try:
        return dtime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(f"{field} must be a time like 22:00 (UTC), not {value!r}", field=field) from None


def _int(data: Mapping[str, Any], key: str, field: str, low: int, high: int, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{field} must be an integer from {low} to {high}", field=field)
    return value


def redacted(url: str) -> str:
    """What is shown of a Slack webhook URL: its origin and the last four characters."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…{url[-4:]}"


def _set_url(sub: Subscription, url: str) -> None:
    """A webhook's URL is stored as is; a Slack URL is the secret that lets anyone post to the
    channel, so it is stored encrypted (like webhook secrets) and only its redacted form shown."""
    if sub.channel == Channel.SLACK:
        sub.url, sub.url_encrypted = redacted(url), crypto.encrypt(url)
    else:
        sub.url, sub.url_encrypted = url, ""


def _apply(sub: Subscription, data: Mapping[str, Any], identity: Identity, *, creating: bool) -> str | None:
    """Validate the JSON fields in ``data`` onto ``sub``; the new secret when one was made."""
    secret: str | None = None
    if creating or "events" in data:
        _apply_events(sub, data.get("events"), identity)
    if creating:
        if "group" in data:
            _apply_group(sub, data, identity)
        _apply_scope(sub, data, identity)
        secret = _apply_channel(sub, data, identity)
    else:
        _apply_changed_url(sub, data)
    _apply_limits(sub, data)
    return secret


def _apply_events(sub: Subscription, events: Any, identity: Identity) -> None:
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        raise InvalidArgument(f"events must be a non-empty list of {', '.join(SUBSCRIBABLE)}", field="events")
    unknown = [e for e in events if e not in SUBSCRIBABLE]
    if unknown:
        raise InvalidArgument(f"events: unknown event {unknown[0]!r}; allowed: {', '.join(SUBSCRIBABLE)}",
                              field="events")
    if set(events) & STAFF_EVENTS and not identity.is_staff:
        raise PermissionDenied(f"only staff may subscribe to {' / '.join(sorted(set(events) & STAFF_EVENTS))}",
                               field="events")
    sub.events = sorted(set(events))


def _apply_group(sub: Subscription, data: Mapping[str, Any], identity: Identity) -> None:
    group = data["group"]
    if not identity.is_staff:
        raise PermissionDenied("only staff may subscribe a group", field="group")
    if not isinstance(group, str) or not Group.objects.filter(name=group).exists():
        raise InvalidArgument(f"group: no such group {group!r}", field="group")
    if data.get("allMyExperiments") is True:
        raise InvalidArgument("a group subscription names an experiment or a filter", field="allMyExperiments")
    sub.group = group


def _apply_scope(sub: Subscription, data: Mapping[str, Any], identity: Identity) -> None:
    given = [k for k in ("experiment", "filter", "allMyExperiments") if k in data]
    if len(given) > 1:
        raise InvalidArgument("give one of experiment, filter or allMyExperiments", field=given[1])
    if "experiment" in data:
        sub.scope, sub.experiment = Scope.EXPERIMENT, _parse_experiment(data["experiment"], identity)
    elif "filter" in data:
        sub.scope, sub.filter = Scope.FILTER, _parse_filter(data["filter"])
    elif data.get("allMyExperiments") is True:
        sub.scope = Scope.MINE
    elif set(sub.events) <= STAFF_EVENTS:
        sub.scope = Scope.NONE
    else:
        raise InvalidArgument("say which experiments: experiment, filter or allMyExperiments: true",
                              field="experiment")


def _apply_channel(sub: Subscription, data: Mapping[str, Any], identity: Identity) -> str | None:
    """The channel of a new subscription; its webhook secret in clear (None for Slack and email)."""
    kinds = [k for k in ("webhook", "slack", "email") if k in data]
    if len(kinds) != 1:
        raise InvalidArgument("give exactly one channel: webhook, slack or email", field="webhook")
    kind = kinds[0]
    conf = data[kind]
    if not isinstance(conf, dict):
        raise InvalidArgument(f"{kind} must be an object", field=kind)
    extra = set(conf) - ({"address"} if kind == "email" else {"url"})
    if extra:
        raise InvalidArgument(f"{kind}: unknown field {sorted(extra)[0]!r}", field=f"{kind}.{sorted(extra)[0]}")
    if kind == "email":
        _apply_email(sub, conf, identity)
        return None
    sub.channel = Channel.WEBHOOK if kind == "webhook" else Channel.SLACK
    _set_url(sub, ssrf.check_url(str(conf.get("url") or ""), field=f"{kind}.url"))
    if kind != "webhook":
        return None
    secret = signing.new_secret()
    sub.secret_encrypted = crypto.encrypt(secret)
    return secret


def _apply_email(sub: Subscription, conf: Mapping[str, Any], identity: Identity) -> None:
    sub.channel = Channel.EMAIL
    address = conf.get("address", identity.email)
    if "address" in conf and sub.group:
        raise InvalidArgument("a group's emails go to its members; give no address", field="email.address")
    if address != identity.email and not identity.is_staff:
        raise PermissionDenied("only staff may send notifications to another address than their own",
                               field="email.address")
    try:
        sub.email = validated_email(address) if isinstance(address, str) else ""
    except ServiceError as exc:
        raise InvalidArgument(f"email.address: {exc.message}", field="email.address") from None
    if not sub.email:
        raise InvalidArgument("email.address must be an email address", field="email.address")


def _apply_changed_url(sub: Subscription, data: Mapping[str, Any]) -> None:
    """An update: only the URL of the channel may change; what names the subscription may not."""
    for fixed in ("experiment", "filter", "allMyExperiments", "email"):
        if fixed in data:
            raise InvalidArgument(f"{fixed} cannot be changed; create a new subscription", field=fixed)
    for kind in ("webhook", "slack"):
        if kind in data:
            if sub.channel != (Channel.WEBHOOK if kind == "webhook" else Channel.SLACK):
                raise InvalidArgument(f"this subscription has no {kind} channel", field=kind)
            conf = data[kind]
            if not isinstance(conf, dict) or set(conf) - {"url"}:
                raise InvalidArgument(f"{kind} must be an object with a url", field=kind)
            _set_url(sub, ssrf.check_url(str(conf.get("url") or ""), field=f"{kind}.url"))


def _apply_limits(sub: Subscription, data: Mapping[str, Any]) -> None:
    sub.queued_minutes = _int(data, "queuedMinutes", "queuedMinutes", 1, 7 * 24 * 60, sub.queued_minutes)
    sub.rate_limit_per_hour = _int(data, "rateLimitPerHour", "rateLimitPerHour", 1, 10_000, sub.rate_limit_per_hour)
    if "quietHours" in data:
        quiet = data["quietHours"]
        if quiet is None:
            sub.quiet_start = sub.quiet_end = None
        elif not isinstance(quiet, dict) or set(quiet) - {"start", "end"}:
            raise InvalidArgument('quietHours must be {"start": "22:00", "end": "07:00"} (UTC) or null',
                                  field="quietHours")
        else:
            sub.quiet_start = _parse_time(quiet.get("start"), "quietHours.start")
            sub.quiet_end = _parse_time(quiet.get("end"), "quietHours.end")
            if (sub.quiet_start is None) != (sub.quiet_end is None):
                raise InvalidArgument("quietHours needs both start and end", field="quietHours")
    if "enabled" in data:
        if not isinstance(data["enabled"], bool):
            raise InvalidArgument("enabled must be true or false", field="enabled")
        sub.enabled = data["enabled"]


ALLOWED_FIELDS = {"group", "experiment", "filter", "allMyExperiments", "events", "webhook", "slack", "email",
                  "queuedMinutes", "rateLimitPerHour", "quietHours", "enabled"}


def _check_fields(data: Any) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise InvalidArgument("the request body must be a JSON object")
    for key in data:
        if key not in ALLOWED_FIELDS:
            raise InvalidArgument(f"unknown field {key!r}; allowed: {', '.join(sorted(ALLOWED_FIELDS))}", field=key)
    return data


def create(identity: Identity, data: Any, *, now: datetime | None = None) -> Created:
    data = _check_fields(data)
    now = now or timezone.now()
    if Subscription.objects.filter(owner=identity.email).count() >= MAX_SUBSCRIPTIONS_PER_OWNER:
        raise InvalidArgument(f"at most {MAX_SUBSCRIPTIONS_PER_OWNER} subscriptions per subscriber")
    sub = Subscription(owner=identity.email, create_time=now, update_time=now)
    secret = _apply(sub, data, identity, creating=True)
    with transaction.atomic():
        sub.save()
    return Created(sub, secret)


def update(identity: Identity, sid: int, data: Any, *, now: datetime | None = None) -> Subscription:
    data = _check_fields(data)
    with transaction.atomic():
        sub = _owned(identity, sid)
        sub = Subscription.objects.select_for_update().get(id=sub.id)
        _apply(sub, data, identity, creating=False)
        sub.update_time = now or timezone.now()
        sub.save()
    return sub


def delete(identity: Identity, sid: int) -> None:
    with transaction.atomic():
        _owned(identity, sid).delete()


def rotate_secret(identity: Identity, sid: int, *, now: datetime | None = None) -> Created:
    """A new secret; the previous keeps signing (beside it) for ROTATION_OVERLAP."""
    now = now or timezone.now()
    with transaction.atomic():
        sub = Subscription.objects.select_for_update().get(id=_owned(identity, sid).id)
        if sub.channel != Channel.WEBHOOK:
            raise InvalidArgument("only a webhook subscription has a secret", field="name")
        secret = signing.new_secret()
        sub.previous_secret_encrypted, sub.previous_secret_expires = sub.secret_encrypted, now + ROTATION_OVERLAP
        sub.secret_encrypted = crypto.encrypt(secret)
        sub.update_time = now
        sub.save()
    return Created(sub, secret)


def send_test(identity: Identity, sid: int, *, now: datetime | None = None) -> Delivery:
    """Queue a TEST message to this subscription (delivered like any other, after commit)."""
    sub = _owned(identity, sid)
    now = now or timezone.now()
    with transaction.atomic():
        event = Event.objects.create(key=f"test/{sub.id}/{time.time_ns()}", type=EventType.TEST,
                                     data={"subscription": sub.id}, create_time=now, done=True)
        delivery = Delivery.objects.create(subscription=sub, type=EventType.TEST, not_before=now,
                                           next_attempt_time=now, create_time=now)
        DeliveryEvent.objects.create(delivery=delivery, event=event, subscription=sub)
        outbox.after_commit(lambda: outbox.enqueue([delivery.id]))
    return delivery


def send_again(delivery_id: int, *, now: datetime | None = None) -> Delivery:
    """Admin: put a delivered, dead or suppressed message back in the outbox (same webhook-id)."""
    now = now or timezone.now()
    with transaction.atomic():
        d = Delivery.objects.select_for_update().get(id=delivery_id)
        if d.status == DeliveryStatus.DELIVERING and d.claimed_until and d.claimed_until > now:
            return d
        d.status, d.attempts, d.next_attempt_time, d.claimed_until, d.done = DeliveryStatus.PENDING, 0, now, None, False
        d.save(update_fields=["status", "attempts", "next_attempt_time", "claimed_until", "done"])
        wu_services.mark_dead_letters_requeued(outbox.DEAD_LETTER_SOURCE, d.id, now=now)  # the operators' list says so
        outbox.after_commit(lambda: outbox.enqueue([d.id]))
    return d


def resend(identity: Identity, sid: int, message_id: str, *, now: datetime | None = None) -> Delivery:
    """The subscriber's "Send again" of one message of their delivery log (the same webhook-id)."""
    sub = _owned(identity, sid)
    d = Delivery.objects.filter(subscription=sub, message_id=message_id).first()
    if d is None:
        raise NotFound(f"subscriptions/{sid} has no message {message_id}", field="delivery")
    if d.status in (DeliveryStatus.PENDING, DeliveryStatus.DELIVERING):
        raise FailedPrecondition(f"{message_id} is still on its way", field="delivery")
    return send_again(d.id, now=now)
