"""Fan-out: events recorded once (by key) and given to every matching subscription once.

One ``DeliveryEvent`` per (event, subscription), unique in the database; one
message per recipient and event however many of their subscriptions match
(:func:`recipient_of`: an email address, a Slack channel's webhook, a webhook
subscription's own endpoint). An email group reaches its members: their own
subscriptions are skipped, and a member already told through another group is
left out of this group's message (``Delivery.left_out``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from experiments import acl
from experiments.acl import Role
from experiments.models import Experiment
from notifications import channels, outbox
from notifications.models import Channel, Delivery, DeliveryEvent, DeliveryStatus, Event, EventType, Scope, Subscription
from xmc import listing
from xmc.api.handlers import EXPERIMENT_FIELDS
from xmc.auth.identity import IDENTITY_CACHE, Identity, identity_for_email
from xmc.listing.errors import ListingError
from core.errors import ServiceError

log = logging.getLogger(__name__)


#: Coalesced within XMC_NOTIFY_COALESCE_S (one message per experiment and window).
COALESCED = frozenset({EventType.WORK_UNIT_FAILED, EventType.WORK_UNIT_QUEUED_TOO_LONG, EventType.WORK_UNIT_IDLE})


# --- Events and fan-out ---------------------------------------------------------------------------------


def record_events(rows: Iterable[Event]) -> list[int]:
    """Insert events idempotently (by key) and return the ids of those not yet fanned out."""
    rows = list(rows)
    if not rows:
        return []
    with transaction.atomic():
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


def may_read(sub: Subscription, xid: int | None, acls: Mapping[str, Any] | None) -> bool:
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
    """Who a subscription's messages reach; two subscriptions with the same recipient get one
    message per event. An email: the address (a group: the group, and its members through
    ``_reached``). Slack: the incoming webhook, which posts to one channel. A webhook: the
    subscription itself, its URL with the secret made for it; two subscriptions on one URL are
    two endpoints, each verifying its own signature (one message signed for the other would
    fail the check)."""
    if sub.channel == Channel.EMAIL:
        return ("group", sub.group) if sub.group else ("email", (sub.email or sub.owner).lower())
    if sub.channel == Channel.SLACK:
        return ("slack", channels.slack_url(sub))
    return ("webhook", f"subscriptions/{sub.id}")


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
    with transaction.atomic():
        events = list(Event.objects.select_for_update(skip_locked=True)
                      .filter(id__in=ids, done=False).order_by("id"))
        if not events:
            return []
        xids = {e.xid for e in events if e.xid is not None}
        pairs = _pairs(events, {x.id: x for x in Experiment.objects.filter(id__in=xids)})
        open_messages = _lock_open_messages(pairs, xids, now)
        new, links, folded = _assign(pairs, open_messages, now)
        Delivery.objects.bulk_create(new)
        DeliveryEvent.objects.bulk_create([DeliveryEvent(delivery=d, event=e, subscription=s) for e, s, d in links])
        for waiting, summary in folded:  # both rows are locked: no claim can be sending ``waiting``
            DeliveryEvent.objects.filter(delivery=waiting).update(delivery=summary)
            waiting.delete()
        Event.objects.filter(id__in=[e.id for e in events]).update(done=True, claimed_until=None)
        _send_after_commit(new, now)
    return [d.id for d in new]


def _reached(sub: Subscription) -> set[tuple[str, str]]:
    """Everyone a subscription's message reaches: its recipient and, for a group's emails, each
    active member's address (so a member's own email subscription is not told twice)."""
    reached = {recipient_of(sub)}
    if sub.channel == Channel.EMAIL and sub.group:
        reached |= {("email", member.lower()) for member in channels.group_members(sub.group)}
    return reached


#: A subscription's share of one event: the members of its email group that already hear of the
#: event through another subscription's message, left out of its own (sorted; () for any other).
Pair = tuple[Event, Subscription, tuple[str, ...]]


def _share(sub: Subscription, reached: set[tuple[str, str]], told: set[tuple[str, str]]) -> tuple[str, ...] | None:
    """Who of ``reached`` still has to be told of an event (``told``: who already is): None when
    nobody, else the addresses of a group's email to leave out."""
    if reached <= told:
        return None
    if not (sub.channel == Channel.EMAIL and sub.group):
        return ()
    members = {who for kind, who in reached if kind == "email"}
    overlap = {who for kind, who in told if kind == "email"} & members
    if members and overlap == members:
        return None  # every member hears of it through another message
    return tuple(sorted(overlap))


def _pairs(events: Sequence[Event], experiments: Mapping[int, Experiment]) -> list[Pair]:
    """The (event, subscription, left out) triples to record: matching, readable, one message per
    recipient and event, not recorded before (the unique row)."""
    asked = Q()
    for kind in sorted({e.type for e in events}):
        asked |= Q(events__contains=[kind])
    candidates = list(Subscription.objects.filter(asked, enabled=True).order_by("id"))
    readable: dict[tuple[int, int | None], bool] = {}
    reached: dict[int, set[tuple[str, str]]] = {}  # by subscription (a Slack URL is decrypted once a chunk)
    had = set(DeliveryEvent.objects.filter(event_id__in=[e.id for e in events])
              .values_list("event_id", "subscription_id"))
    pairs: list[Pair] = []
    for event in events:
        experiment = experiments.get(event.xid) if event.xid is not None else None
        happened = happened_at(event)
        told: set[tuple[str, str]] = set()
        # Per recipient, one message per event however many of their subscriptions match: a
        # group's first (its emails reach the members; a member already told through an earlier
        # group is left out of a later one), then the one that also wants EXPERIMENT_FINISHED (so
        # the summary can fold in the failures), then the oldest. The same order on every run:
        # a fan-out run again decides the same.
        matching = sorted(_matching(event, experiment, candidates),
                          key=lambda s: (not s.group, EventType.EXPERIMENT_FINISHED not in s.events, s.id))
        for sub in matching:
            if happened < sub.create_time:
                continue  # a subscription never hears of what happened before it existed
            key = (sub.id, event.xid)
            if key not in readable:  # checked again at send time
                readable[key] = may_read(sub, event.xid, experiment.acls if experiment else None)
            if not readable[key]:
                continue
            if sub.id not in reached:
                reached[sub.id] = _reached(sub)
            left_out = _share(sub, reached[sub.id], told)
            if left_out is None:
                continue
            told |= reached[sub.id]
            if (event.id, sub.id) not in had:
                pairs.append((event, sub, left_out))
    return pairs


#: An open message's coalescing key: (subscription, experiment, type, left out).
Open = tuple[int, int | None, str, tuple[str, ...]]


def _lock_open_messages(pairs: Sequence[Pair], xids: set[int], now: datetime) -> dict[Open, Delivery]:
    """Lock the coalescing subscribers, and those told an experiment finished (its summary folds in
    their open failure message), in id order (one fan-out per subscriber at a time, no lock cycles);
    their messages still collecting events, by (subscription, experiment, type, left out)."""
    coalescing = sorted({sub.id for event, sub, _ in pairs
                         if event.type in COALESCED or event.type == EventType.EXPERIMENT_FINISHED})
    open_messages: dict[Open, Delivery] = {}
    if not coalescing:
        return open_messages
    list(Subscription.objects.select_for_update().filter(id__in=coalescing).order_by("id")
         .values_list("id", flat=True))
    for d in (Delivery.objects.select_for_update(of=("self",))
              .filter(subscription_id__in=coalescing, xid__in=xids, type__in=sorted(COALESCED),
                      status=DeliveryStatus.PENDING, attempts=0, not_before__gt=now).order_by("id")):
        open_messages.setdefault((d.subscription_id, d.xid, d.type, tuple(d.left_out)), d)
    return open_messages


Link = tuple[Event, Subscription, Delivery]


def _assign(pairs: Sequence[Pair], open_messages: dict[Open, Delivery],
            now: datetime) -> tuple[list[Delivery], list[Link], list[tuple[Delivery, Delivery]]]:
    """Each pair's message: an open one that coalesces it (same subscription, experiment, type and
    members left out), or a new one. Returns the new messages, the links, and the (stored open
    failure message, summary) pairs to fold."""
    window = timedelta(seconds=settings.XMC_NOTIFY_COALESCE_S)
    new: list[Delivery] = []
    links: list[Link] = []
    folded: list[tuple[Delivery, Delivery]] = []
    for event, sub, left_out in pairs:
        group = (sub.id, event.xid, event.type, left_out)
        delivery = open_messages.get(group) if event.type in COALESCED else None
        if delivery is None:
            start = now + window if event.type in COALESCED else now
            delivery = Delivery(subscription=sub, type=event.type, xid=event.xid, not_before=start,
                                next_attempt_time=start, create_time=now, left_out=list(left_out))
            new.append(delivery)
            if event.type in COALESCED and start > now:
                open_messages[group] = delivery  # later events of this chunk join it
        if event.type == EventType.EXPERIMENT_FINISHED:
            # "Finished" must not overtake the failures still waiting out their coalescing
            # window: the open failure message is folded into it (one message, failures listed).
            waiting = open_messages.pop((sub.id, event.xid, EventType.WORK_UNIT_FAILED, left_out), None)
            if waiting is not None and waiting.pk is None:
                new.remove(waiting)
                links = [(e, s, delivery if d is waiting else d) for e, s, d in links]
            elif waiting is not None:
                folded.append((waiting, delivery))
        links.append((event, sub, delivery))
    return new, links, folded


def _send_after_commit(new: Sequence[Delivery], now: datetime) -> None:
    """The new messages go to the queue once the fan-out commits: the due ones together, the
    coalescing ones when their window closes."""
    due = [d.id for d in new if d.not_before <= now]
    later = [(d.id, (d.not_before - now).total_seconds()) for d in new if d.not_before > now]

    def send() -> None:
        outbox.enqueue(due)
        for did, countdown in later:
            outbox.enqueue([did], countdown=countdown)

    outbox.after_commit(send)
