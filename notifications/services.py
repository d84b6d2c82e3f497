"""Notification services: subscriptions (CRUD for their owner), fan-out of events into the
outbox, and the delivery of one outbox row. Views, tasks and the admin are thin over these.

Delivery guarantees (docs/architecture/notifications.md, "Delivery"):

* one :class:`~notifications.models.DeliveryEvent` per (event, subscription),
  unique in the database: an event reaches a subscription at most once, however
  often it is fanned out (a redelivered task, two workers);
* a delivery is claimed in a row-locked transaction that moves it to DELIVERING
  with a lease and counts the try; only the claimer sends; a worker that dies
  mid-send leaves the lease to run out, and the next claim sends the same
  ``message_id`` (``webhook-id``) and the same body again;
* failures retry with exponential backoff and full jitter up to
  ``XMC_NOTIFY_MAX_ATTEMPTS`` tries, then the delivery is a dead letter (DEAD);
* a subscription whose sends fail ``XMC_NOTIFY_BREAKER_FAILURES`` times in a row
  opens its circuit for ``XMC_NOTIFY_BREAKER_OPEN_S``: its deliveries wait,
  uncounted; the breaker is per subscription (``channels.breaker_key``), so one
  subscriber's failing receiver never delays another's;
* the experiment's ACLs decide at send time: a subscriber who may not read the
  experiment gets nothing (SUPPRESSED).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from datetime import time as dtime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, Min, OuterRef, Q, Subquery
from django.utils import timezone

from core.queues import Queue
from delivery import backoff as backoffs
from delivery import broker, leases
from experiments import acl
from experiments.acl import Role
from experiments.models import Experiment
from notifications import channels, crypto, details, payloads, signing, ssrf
from notifications.models import (
    Channel,
    Delivery,
    DeliveryAttempt,
    DeliveryEvent,
    DeliveryStatus,
    EndpointHealth,
    Event,
    EventType,
    Scope,
    Subscription,
)
from xmc import listing
from xmc.api.handlers import EXPERIMENT_FIELDS
from xmc.auth.identity import IDENTITY_CACHE, Identity, identity_for_email, validated_email
from xmc.listing.errors import ListingError
from core.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, ServiceError

log = logging.getLogger(__name__)

#: Event types that concern one experiment (the others are for staff: the scheduling switch).
EXPERIMENT_EVENTS = frozenset({EventType.WORK_UNIT_FAILED, EventType.EXPERIMENT_FINISHED,
                               EventType.WORK_UNIT_QUEUED_TOO_LONG})
STAFF_EVENTS = frozenset({EventType.SCHEDULING_PAUSED, EventType.SCHEDULING_RESUMED,
                          EventType.OPERATOR_DELIVERY_DEGRADED})
#: Coalesced within XMC_NOTIFY_COALESCE_S (one message per experiment and window).
COALESCED = frozenset({EventType.WORK_UNIT_FAILED, EventType.WORK_UNIT_QUEUED_TOO_LONG})
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
#: The longest countdown a deliver task is sent with (well under XMC_CELERY_VISIBILITY_TIMEOUT_S).
MAX_COUNTDOWN_S = 600.0
MAX_SUBSCRIPTIONS_PER_OWNER = 100

#: Task names of the notifications queue (notifications.tasks registers them).
FAN_OUT_TASK = "xmc.notifications.fan_out"
DELIVER_TASK = "xmc.notifications.deliver"
SWEEP_TASK = "xmc.notifications.sweep"


def _after_commit(callback: Any) -> None:
    """Run ``callback`` once the current transaction commits (the enqueueing of tasks)."""
    transaction.on_commit(callback)


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
        events = data.get("events")
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
    if creating and "group" in data:
        group = data["group"]
        if not identity.is_staff:
            raise PermissionDenied("only staff may subscribe a group", field="group")
        from django.contrib.auth.models import Group

        if not isinstance(group, str) or not Group.objects.filter(name=group).exists():
            raise InvalidArgument(f"group: no such group {group!r}", field="group")
        if data.get("allMyExperiments") is True:
            raise InvalidArgument("a group subscription names an experiment or a filter", field="allMyExperiments")
        sub.group = group
    if creating:
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
        else:
            sub.channel = Channel.WEBHOOK if kind == "webhook" else Channel.SLACK
            _set_url(sub, ssrf.check_url(str(conf.get("url") or ""), field=f"{kind}.url"))
            if kind == "webhook":
                secret = signing.new_secret()
                sub.secret_encrypted = crypto.encrypt(secret)
    else:
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
    return secret


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
        _after_commit(lambda: enqueue([delivery.id]))
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
        _after_commit(lambda: enqueue([d.id]))
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


# --- Events and fan-out ---------------------------------------------------------------------------------


def record_events(rows: Iterable[Event]) -> list[int]:
    """Insert events idempotently (by key) and return the ids of those not yet fanned out."""
    rows = list(rows)
    if not rows:
        return []
    Event.objects.bulk_create(rows, ignore_conflicts=True)
    return list(Event.objects.filter(key__in=[r.key for r in rows], done=False).values_list("id", flat=True))


def subscriber_identity(sub: Subscription) -> Identity | None:
    """Whose rights decide: the owner, or for a group subscription the group as a principal (None: deactivated)."""
    if sub.group:
        return Identity(email=f"group:{sub.group}", groups=frozenset({sub.group}))
    try:
        # Through the API's identity cache: a change of rights counts within XMC_IDENTITY_CACHE_S.
        return IDENTITY_CACHE.lookup(sub.owner)
    except ServiceError:  # a deactivated user
        return None


def _may_read(sub: Subscription, xid: int | None, acls: Mapping[str, Any] | None) -> bool:
    identity = subscriber_identity(sub)
    if identity is None:
        return False
    if sub.group and xid is None:  # staff events: the staff member who made it must still be staff
        owner = identity_for_email(sub.owner) if sub.owner else None
        return bool(owner and owner.is_staff)
    if xid is None:
        return identity.is_staff
    return acls is not None and acl.role_of(identity, acls) >= Role.READER


def happened_at(event: Event) -> datetime:
    """When the fact happened: the experiment's end for EXPERIMENT_FINISHED (the sweep may record
    it minutes later), else when the event was recorded (right after the writer's commit)."""
    when = event.data.get("time") if isinstance(event.data, dict) else None
    if isinstance(when, str):
        try:
            return datetime.fromisoformat(when)
        except ValueError:
            pass
    return event.create_time


def recipient_of(sub: Subscription) -> tuple[str, str]:
    """Who a subscription's messages reach: an email address (or a group), a webhook URL, a
    Slack URL. Two subscriptions with the same recipient get one message per event."""
    if sub.channel == Channel.EMAIL:
        return ("group", sub.group) if sub.group else ("email", (sub.email or sub.owner).lower())
    if sub.channel == Channel.SLACK:
        return ("slack", channels.slack_url(sub))
    return ("webhook", sub.url)


def _matching(event: Event, experiment: Experiment | None, candidates: Sequence[Subscription]) -> list[Subscription]:
    """The enabled subscriptions (``candidates``) that ask for ``event``."""
    subs = [s for s in candidates if event.type in s.events]
    if event.type == EventType.WORK_UNIT_QUEUED_TOO_LONG:
        subs = [s for s in subs if s.id == event.data.get("subscription")]
    if event.xid is None:
        return subs  # staff events: only staff may subscribe to them, checked again at send time
    if experiment is None:
        return []
    result = []
    for sub in subs:
        if sub.scope == Scope.NONE or (sub.scope == Scope.EXPERIMENT and sub.experiment_id != event.xid):
            continue
        if sub.scope == Scope.MINE and sub.owner != experiment.creator:
            continue
        if sub.scope == Scope.FILTER and not _filter_matches(sub.filter, experiment.id):
            continue
        result.append(sub)
    return result


def _filter_matches(text: str, xid: int) -> bool:
    try:
        return Experiment.objects.filter(listing.compile_filter(text, EXPERIMENT_FIELDS), id=xid).exists()
    except ListingError:
        return False


def fan_out(event_id: int, *, now: datetime | None = None) -> list[int]:
    """Give one event to every matching subscription once (:func:`fan_out_many` of one)."""
    return fan_out_many([event_id], now=now)


#: Events fanned out per transaction: big enough to amortise the round trips, small enough
#: that the row locks are held briefly.
FAN_OUT_CHUNK = 500


def fan_out_many(event_ids: Sequence[int], *, now: datetime | None = None) -> list[int]:
    """Give events to every matching subscription once; returns the deliveries created.

    Idempotent and safe from any number of workers: each chunk of events is
    taken under row locks (``SKIP LOCKED``: an event another worker is fanning
    out is left to it; if that worker dies the event stays not fanned out and
    the sweep hands it out again), the unique (event, subscription) row is the
    record that a subscription already has it, and the event's ``done`` flag is
    set in the same transaction as the deliveries. The subscriptions that
    coalesce are locked in id order (one fan-out per subscriber at a time, no
    lock cycles). A chunk costs a fixed number of queries, not a few per event.
    """
    ids = sorted({int(i) for i in event_ids})
    created: list[int] = []
    for start in range(0, len(ids), FAN_OUT_CHUNK):
        created += _fan_out_chunk(ids[start:start + FAN_OUT_CHUNK], now or timezone.now())
    return created


def _fan_out_chunk(ids: Sequence[int], now: datetime) -> list[int]:
    window = timedelta(seconds=settings.XMC_NOTIFY_COALESCE_S)
    with transaction.atomic():
        events = list(Event.objects.select_for_update(skip_locked=True)
                      .filter(id__in=ids, done=False).order_by("id"))
        if not events:
            return []
        xids = {e.xid for e in events if e.xid is not None}
        experiments = {x.id: x for x in Experiment.objects.filter(id__in=xids)}
        asked = Q()
        for kind in sorted({e.type for e in events}):
            asked |= Q(events__contains=[kind])
        candidates = list(Subscription.objects.filter(asked, enabled=True).order_by("id"))
        readable: dict[tuple[int, int | None], bool] = {}
        recipient: dict[int, tuple[str, str]] = {}  # by subscription (a Slack URL is decrypted once a chunk)
        pairs: list[tuple[Event, Subscription]] = []
        # An event reaches a subscription once (the unique row): pairs already recorded are skipped.
        had = set(DeliveryEvent.objects.filter(event_id__in=[e.id for e in events])
                  .values_list("event_id", "subscription_id"))
        for event in events:
            experiment = experiments.get(event.xid) if event.xid is not None else None
            happened = happened_at(event)
            recipients: set[tuple[str, str]] = set()
            # Per recipient, one message per event however many of their subscriptions match:
            # the one that also wants EXPERIMENT_FINISHED first (so the summary can fold in the
            # failures), then the oldest.
            matching = sorted(_matching(event, experiment, candidates),
                              key=lambda s: (EventType.EXPERIMENT_FINISHED not in s.events, s.id))
            for sub in matching:
                if happened < sub.create_time:
                    continue  # a subscription never hears of what happened before it existed
                key = (sub.id, event.xid)
                if key not in readable:  # checked again at send time
                    readable[key] = _may_read(sub, event.xid, experiment.acls if experiment else None)
                if not readable[key]:
                    continue
                if sub.id not in recipient:
                    recipient[sub.id] = recipient_of(sub)
                if recipient[sub.id] in recipients:
                    continue
                recipients.add(recipient[sub.id])
                if (event.id, sub.id) not in had:
                    pairs.append((event, sub))
        # Coalescing subscribers, and those told an experiment finished (its summary folds in
        # their open failure message), are locked in id order: one fan-out per subscriber at a time.
        coalescing = sorted({sub.id for event, sub in pairs
                             if event.type in COALESCED or event.type == EventType.EXPERIMENT_FINISHED})
        if coalescing:
            list(Subscription.objects.select_for_update().filter(id__in=coalescing).order_by("id")
                 .values_list("id", flat=True))
        open_messages: dict[tuple[int, int | None, str], Delivery] = {}
        if coalescing:
            for d in (Delivery.objects.select_for_update(of=("self",))
                      .filter(subscription_id__in=coalescing, xid__in=xids, type__in=sorted(COALESCED),
                              status=DeliveryStatus.PENDING, attempts=0, not_before__gt=now).order_by("id")):
                open_messages.setdefault((d.subscription_id, d.xid, d.type), d)
        new: list[Delivery] = []
        links: list[tuple[Event, Subscription, Delivery]] = []
        folded: list[tuple[Delivery, Delivery]] = []  # (open failure message already stored, the summary)
        for event, sub in pairs:
            group = (sub.id, event.xid, event.type)
            delivery = open_messages.get(group) if event.type in COALESCED else None
            if delivery is None:
                start = now + window if event.type in COALESCED else now
                delivery = Delivery(subscription=sub, type=event.type, xid=event.xid, not_before=start,
                                    next_attempt_time=start, create_time=now)
                new.append(delivery)
                if event.type in COALESCED and start > now:
                    open_messages[group] = delivery  # later events of this chunk join it
            if event.type == EventType.EXPERIMENT_FINISHED:
                # "Finished" must not overtake the failures still waiting out their coalescing
                # window: the open failure message is folded into it (one message, failures listed).
                waiting = open_messages.pop((sub.id, event.xid, EventType.WORK_UNIT_FAILED), None)
                if waiting is not None and waiting.pk is None:
                    new.remove(waiting)
                    links = [(e, s, delivery if d is waiting else d) for e, s, d in links]
                elif waiting is not None:
                    folded.append((waiting, delivery))
            links.append((event, sub, delivery))
        Delivery.objects.bulk_create(new)
        DeliveryEvent.objects.bulk_create([DeliveryEvent(delivery=d, event=e, subscription=s) for e, s, d in links])
        for waiting, summary in folded:  # both rows are locked: no claim can be sending ``waiting``
            DeliveryEvent.objects.filter(delivery=waiting).update(delivery=summary)
            waiting.delete()
        Event.objects.filter(id__in=[e.id for e in events]).update(done=True, claimed_until=None)
        due = [d.id for d in new if d.not_before <= now]
        later = [(d.id, (d.not_before - now).total_seconds()) for d in new if d.not_before > now]

        def send() -> None:
            enqueue(due)
            for did, countdown in later:
                enqueue([did], countdown=countdown)

        _after_commit(send)
    return [d.id for d in new]


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


def enqueue_fan_out(event_ids: Sequence[int]) -> None:
    """Hand events to the fan-out task; one the broker did not take stays due (``sweep_events``)."""
    if not event_ids:
        return
    try:
        broker.publish(FAN_OUT_TASK, [list(event_ids)], queue=Queue.NOTIFICATIONS.value)
    except Exception:
        log.warning("notifications.fan_out_enqueue_failed", extra={"events": len(event_ids)}, exc_info=True)
        return
    leases.mark_sent(Event, list(event_ids))


# --- Delivery ---------------------------------------------------------------------------------------


def backoff_s(attempt: int) -> float:
    """The wait after failed try ``attempt`` (from 1): ``delivery.backoff.jittered`` with the notify base and cap."""
    return backoffs.jittered(attempt - 1, base=settings.XMC_NOTIFY_BACKOFF_S, cap=settings.XMC_NOTIFY_BACKOFF_MAX_S)


def _in_quiet_hours(sub: Subscription, now: datetime) -> datetime | None:
    """The end of the quiet hours when ``now`` (UTC) falls in them, else None."""
    start, end = sub.quiet_start, sub.quiet_end
    if start is None or end is None or start == end:
        return None
    t = now.astimezone(dt_timezone.utc).time()
    inside = (start <= t < end) if start < end else (t >= start or t < end)
    if not inside:
        return None
    day = now.astimezone(dt_timezone.utc).date()
    until = datetime.combine(day, end, tzinfo=dt_timezone.utc)
    return until if until > now else until + timedelta(days=1)


def _rate_limited(sub: Subscription, sent_last_hour: int, first_sent: datetime | None) -> datetime | None:
    """Until when the subscriber's hourly limit holds its messages back (None: under the limit)."""
    if sent_last_hour < sub.rate_limit_per_hour or first_sent is None:
        return None
    return first_sent + timedelta(hours=1)


def _record_failure(endpoint: str, now: datetime) -> None:
    """A failure counts towards opening the subscription's circuit (``endpoint`` is its
    ``channels.breaker_key``; a success closes it: :func:`_record_sent`)."""
    row, _ = EndpointHealth.objects.select_for_update().get_or_create(endpoint=endpoint,
                                                                      defaults={"update_time": now})
    row.consecutive_failures += 1
    if row.consecutive_failures >= settings.XMC_NOTIFY_BREAKER_FAILURES:
        row.open_until = now + timedelta(seconds=settings.XMC_NOTIFY_BREAKER_OPEN_S)
    row.update_time = now
    row.save()


@dataclass(frozen=True)
class Outcome:
    """What one call of :func:`deliver` did (for the task and the tests)."""

    action: str  # sent, failed, dead, suppressed, postponed, leased, done, not_due, missing
    retry_in: float | None = None


def _postpone(d: Delivery, until: datetime, reason: str) -> Outcome:
    d.next_attempt_time = until
    if d.attempts == 0:
        d.not_before = max(d.not_before, until)  # keeps collecting events of the experiment meanwhile
    d.last_error = reason
    d.save(update_fields=["next_attempt_time", "not_before", "last_error"])
    delay = (until - timezone.now()).total_seconds()
    _after_commit(lambda: enqueue([d.id], countdown=delay))
    return Outcome("postponed", delay)


def _events_of(delivery_ids: Sequence[int]) -> dict[int, list[Event]]:
    """The events each delivery carries, in event order."""
    found: dict[int, list[Event]] = {}
    if delivery_ids:
        for item in (DeliveryEvent.objects.filter(delivery_id__in=list(delivery_ids)).select_related("event")
                     .order_by("event_id")):
            found.setdefault(item.delivery_id, []).append(item.event)
    return found


def _failure_details(events: Mapping[int, Sequence[Event]]) -> dict[int, dict[tuple[int, int], dict[str, Any]]]:
    """By experiment, what the messages being built say of their listed failed units (job, args
    that differ, reason, last line): one read per experiment, however many messages list it."""
    wanted: dict[int, set[tuple[int, int]]] = {}
    for mine in events.values():
        failed = [e for e in sorted(mine, key=lambda e: e.id) if e.type == EventType.WORK_UNIT_FAILED]
        for e in failed[:payloads.MAX_LISTED]:
            if e.xid is not None and e.wid is not None and e.eid is not None:
                wanted.setdefault(e.xid, set()).add((e.wid, e.eid))
    return {xid: details.failure_details(xid, units) for xid, units in sorted(wanted.items())}


@dataclass(frozen=True)
class _Claimable:
    delivery: Delivery
    experiment: Experiment | None  # id, title, creator and ACLs only
    sent_last_hour: int
    first_sent_last_hour: datetime | None


def _claimable(delivery_ids: Sequence[int], now: datetime) -> list[_Claimable]:
    """The deliveries, row-locked (``SKIP LOCKED``: one another worker is claiming is left to it),
    with their subscriptions and, in the same query, what the checks need: each one's experiment
    and its subscriber's messages delivered in the last hour."""
    experiment = Experiment.objects.filter(id=OuterRef("xid"))
    sent = (Delivery.objects.filter(subscription=OuterRef("subscription"), status=DeliveryStatus.DELIVERED,
                                    delivered_time__gt=now - timedelta(hours=1))
            .exclude(type=EventType.TEST).order_by().values("subscription"))
    rows = (Delivery.objects.select_for_update(of=("self",), skip_locked=True).select_related("subscription")
            .annotate(x_found=Exists(experiment), x_title=Subquery(experiment.values("title")),
                      x_creator=Subquery(experiment.values("creator")), x_acls=Subquery(experiment.values("acls")),
                      x_sent=Subquery(sent.annotate(n=Count("id")).values("n")),
                      x_first_sent=Subquery(sent.annotate(t=Min("delivered_time")).values("t")))
            .filter(id__in=list(delivery_ids)).order_by("id"))
    return [_Claimable(d, Experiment(id=d.xid, title=d.x_title, creator=d.x_creator, acls=d.x_acls)
                       if d.x_found else None, int(d.x_sent or 0), d.x_first_sent) for d in rows]


@dataclass
class _Claimed:
    delivery: Delivery
    adapter: channels.ChannelAdapter
    endpoint: str
    result: channels.SendResult | None = None
    latency_ms: int = 0


#: Deliveries one ``deliver`` task carries (enqueue batches those that are due together).
DELIVER_BATCH = 50


def deliver(delivery_id: int, *, now: datetime | None = None) -> Outcome:
    """Claim, send and record one delivery (:func:`deliver_many` of one)."""
    return deliver_many([delivery_id], now=now)[delivery_id]


def deliver_many(delivery_ids: Sequence[int], *, now: datetime | None = None) -> dict[int, Outcome]:
    """Claim, send and record deliveries (idempotent; safe from any number of workers).

    One transaction claims the whole batch in a fixed number of queries (the
    rows, the circuit breakers, the events of first tries, one bulk update);
    the claimed messages are then sent outside it, up to
    ``XMC_NOTIFY_SEND_CONCURRENCY`` at a time, and the successes recorded in
    one statement. Each delivery's outcome is what :func:`deliver` says of it.
    """
    now = now or timezone.now()
    ids = sorted({int(i) for i in delivery_ids})
    outcomes: dict[int, Outcome] = {}
    claimed: list[_Claimed] = []
    with transaction.atomic():
        found = _claimable(ids, now)
        absent = set(ids) - {f.delivery.id for f in found}
        if absent:  # locked by another worker's claim right now, or no such delivery
            present = set(Delivery.objects.filter(id__in=absent).values_list("id", flat=True))
            outcomes.update({i: Outcome("leased" if i in present else "missing") for i in absent})
        readable: dict[tuple[int, int | None], bool] = {}
        in_batch: dict[int, int] = {}  # subscription -> messages claimed in this batch
        candidates: list[tuple[_Claimable, channels.ChannelAdapter, str]] = []
        for f in found:
            d, sub, experiment = f.delivery, f.delivery.subscription, f.experiment
            if d.status in (DeliveryStatus.DELIVERED, DeliveryStatus.DEAD, DeliveryStatus.SUPPRESSED):
                outcomes[d.id] = Outcome("done")
                continue
            if d.status == DeliveryStatus.DELIVERING and d.claimed_until and d.claimed_until > now:
                outcomes[d.id] = Outcome("leased", (d.claimed_until - now).total_seconds())
                continue
            due = max(d.next_attempt_time, d.not_before)
            if due > now:
                outcomes[d.id] = Outcome("not_due", (due - now).total_seconds())
                continue
            if d.type != EventType.TEST:
                if not sub.enabled:
                    outcomes[d.id] = _suppress(d, "the subscription is disabled")
                    continue
                key = (sub.id, d.xid)
                if key not in readable:
                    readable[key] = _may_read(sub, d.xid, experiment.acls if experiment else None)
                if not readable[key]:
                    what = f"experiments/{d.xid}" if d.xid is not None else "staff events"
                    who = f"group {sub.group}" if sub.group else sub.owner
                    outcomes[d.id] = _suppress(d, f"{who} may not read {what}")
                    continue
                if d.attempts == 0:
                    quiet = _in_quiet_hours(sub, now)
                    if quiet:
                        outcomes[d.id] = _postpone(d, quiet, "quiet hours")
                        continue
                    limited = _rate_limited(sub, f.sent_last_hour + in_batch.get(sub.id, 0),
                                            f.first_sent_last_hour or now)
                    if limited:
                        outcomes[d.id] = _postpone(d, limited,
                                                   f"rate limit: {sub.rate_limit_per_hour} messages per hour")
                        continue
                    in_batch[sub.id] = in_batch.get(sub.id, 0) + 1
            adapter = channels.adapter(sub)
            candidates.append((f, adapter, channels.breaker_key(sub)))
        opened: dict[str, datetime] = {
            endpoint: until for endpoint, until in EndpointHealth.objects.filter(
                endpoint__in=sorted({c[2] for c in candidates}), open_until__gt=now).values_list("endpoint", "open_until")
            if until is not None}
        bodies = [c[0] for c in candidates if c[2] not in opened and not c[0].delivery.body]
        events = _events_of([f.delivery.id for f in bodies])
        unit_details = _failure_details(events)
        for f, adapter, endpoint in candidates:
            d = f.delivery
            if endpoint in opened:
                outcomes[d.id] = _postpone(d, opened[endpoint], f"circuit open for {endpoint}")
                continue
            if not d.body:
                mine = events.get(d.id, [])
                if f.experiment is not None:
                    for e in mine:
                        e.data = {**e.data, "title": f.experiment.title}
                d.body = payloads.dumps(payloads.build(d.type, mine, now, unit_details.get(d.xid or 0)))
                d.timestamp = int(now.timestamp())
            d.status = DeliveryStatus.DELIVERING
            d.attempts += 1
            d.claimed_until = now + timedelta(seconds=settings.XMC_NOTIFY_LEASE_S)
            claimed.append(_Claimed(d, adapter, endpoint))
        Delivery.objects.bulk_update([c.delivery for c in claimed],
                                     ["status", "attempts", "claimed_until", "body", "timestamp"])
    _send_all(claimed)
    outcomes.update(_record_all(claimed))
    return outcomes


def _send_one(c: _Claimed) -> None:
    started = time.monotonic()
    d = c.delivery
    try:
        c.result = c.adapter.send(d.subscription, d.message_id, d.body)
    except Exception as exc:  # an adapter bug must not strand the delivery in DELIVERING
        log.exception("notifications.send_crashed", extra={"delivery": d.id})
        c.result = channels.SendResult(False, None, f"{type(exc).__name__}: {exc}"[:1000])
    c.latency_ms = int((time.monotonic() - started) * 1000)


def _send_all(claimed: Sequence[_Claimed]) -> None:
    """Send outside any transaction, several at a time (each adapter call has its own timeout)."""
    width = min(len(claimed), max(1, settings.XMC_NOTIFY_SEND_CONCURRENCY))
    if width <= 1:
        for c in claimed:
            _send_one(c)
        return

    def send(c: _Claimed) -> None:
        try:
            _send_one(c)
        finally:
            connection.close()  # a pool thread's own connection (an email to a group reads its members)

    with ThreadPoolExecutor(width, thread_name_prefix="notify-send") as pool:
        list(pool.map(send, claimed))


def _suppress(d: Delivery, reason: str) -> Outcome:
    d.status, d.last_error, d.done = DeliveryStatus.SUPPRESSED, reason, True
    d.save(update_fields=["status", "last_error", "done"])
    log.info("notifications.suppressed", extra={"delivery": d.id, "reason": reason})
    return Outcome("suppressed")


def _record_all(claimed: Sequence[_Claimed]) -> dict[int, Outcome]:
    """Log every try and move each delivery on; the successes in one statement."""
    sent = [c for c in claimed if c.result is not None and c.result.ok]
    outcomes = {c.delivery.id: Outcome("sent") for c in sent}
    if sent:
        _record_sent(sent, timezone.now())
    for c in claimed:
        if c.result is not None and not c.result.ok:
            outcomes[c.delivery.id] = _record_failed(c.delivery.id, c.delivery.attempts, c.endpoint, c.result,
                                                     c.latency_ms)
    return outcomes


def _record_failed(delivery_id: int, attempt: int, endpoint: str, result: channels.SendResult,
                   latency_ms: int) -> Outcome:
    """Log the failed try and schedule the next (or make it DEAD), unless the delivery was taken
    over after our lease ran out: then only the try is logged."""
    now = timezone.now()
    fields: dict[str, Any] = {"last_status_code": result.status_code, "last_error": result.error,
                              "claimed_until": None}
    if not result.retryable or attempt >= settings.XMC_NOTIFY_MAX_ATTEMPTS:
        fields["status"], fields["done"], outcome, delay = DeliveryStatus.DEAD, True, Outcome("dead"), None
    else:
        delay = backoff_s(attempt)
        fields.update(status=DeliveryStatus.PENDING, next_attempt_time=now + timedelta(seconds=delay))
        outcome = Outcome("failed", delay)
    with transaction.atomic():
        DeliveryAttempt.objects.create(delivery_id=delivery_id, number=attempt, time=now, latency_ms=latency_ms,
                                       status_code=result.status_code, ok=False, error=result.error)
        _record_failure(endpoint, now)
        ours = Q(id=delivery_id, attempts=attempt, status=DeliveryStatus.DELIVERING)
        if not Delivery.objects.filter(ours).update(**fields):
            return Outcome("failed")  # taken over after our lease ran out
        if outcome.action == "dead":
            log.warning("notifications.dead_letter", extra={"delivery": delivery_id, "error": result.error})
        if delay is not None:
            _after_commit(lambda: enqueue([delivery_id], countdown=delay))
    return outcome


def _record_sent(sent: Sequence[_Claimed], now: datetime) -> None:
    """The successes in one statement (atomic on its own): log each try, close the endpoints'
    failure streaks if they had one, and mark each delivery DELIVERED unless it was taken over
    after our lease ran out."""
    attempts, health, deliveries = (DeliveryAttempt._meta.db_table, EndpointHealth._meta.db_table,
                                    Delivery._meta.db_table)
    rows = ", ".join(["(%s::bigint, %s::integer, %s::integer, %s::integer, %s::text)"] * len(sent))
    params: list[Any] = []
    for c in sent:
        assert c.result is not None
        params += [c.delivery.id, c.delivery.attempts, c.result.status_code, c.latency_ms, c.result.error]
    sql = f"""
        WITH v(id, attempt, status_code, latency_ms, error) AS (VALUES {rows}),
        logged AS (
            INSERT INTO {attempts} (delivery_id, number, time, latency_ms, status_code, ok, error)
            SELECT id, attempt, %s, latency_ms, status_code, true, error FROM v RETURNING 1
        ), healed AS (
            UPDATE {health} SET consecutive_failures = 0, open_until = NULL, update_time = %s
            WHERE endpoint = ANY(%s) AND consecutive_failures > 0 RETURNING 1
        )
        UPDATE {deliveries} AS d SET status = %s, delivered_time = %s, last_status_code = v.status_code,
                                     last_error = v.error, claimed_until = NULL, done = true
        FROM v WHERE d.id = v.id AND d.attempts = v.attempt AND d.status = %s"""
    params += [now, now, sorted({c.endpoint for c in sent}), DeliveryStatus.DELIVERED, now,
               DeliveryStatus.DELIVERING]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


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
