"""Sending deliveries: claim a batch, send outside the transaction, record every try.

* a delivery is claimed in a row-locked transaction that moves it to DELIVERING
  with a lease (``claimed_until``, ``delivery.models.Leased``) and counts the
  try; only the claimer sends; a worker that dies mid-send leaves the lease to
  run out, and the next claim sends the same ``message_id`` (``webhook-id``)
  and the same body again;
* failures retry with ``delivery.backoff.jittered`` up to
  ``XMC_NOTIFY_MAX_ATTEMPTS`` tries, then the delivery is a dead letter (DEAD, done);
* a subscription whose sends fail ``XMC_NOTIFY_BREAKER_FAILURES`` times in a row
  opens its circuit for ``XMC_NOTIFY_BREAKER_OPEN_S``: its deliveries wait,
  uncounted; the breaker is per subscription (``channels.breaker_key``);
* the experiment's ACLs decide at send time: a subscriber who may not read the
  experiment gets nothing (SUPPRESSED).
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, Min, OuterRef, Q, Subquery
from django.utils import timezone

from delivery import backoff as backoffs
from delivery import leases
from experiments.models import Experiment
from notifications import channels, details, fanout, outbox, payloads
from notifications.models import (
    Delivery,
    DeliveryAttempt,
    DeliveryEvent,
    DeliveryStatus,
    EndpointHealth,
    Event,
    EventType,
    Subscription,
)
from workunits import services as wu_services

log = logging.getLogger(__name__)


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


#: Seconds before a delivery found row-locked by another transaction is looked at again (the floor's).
LOCKED_RETRY_S = leases.LOCKED_RETRY_S


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
    outbox.after_commit(lambda: outbox.enqueue([d.id], countdown=delay))
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
class _Prefetched:
    """What the bodies of a batch's first tries say, read before the claim's transaction: the
    events of each delivery and what they say of their failed units (``notifications.details``:
    the last log line may come from the cluster, bounded, and no row lock waits on it)."""

    events: dict[int, list[Event]]
    details: dict[int, dict[tuple[int, int], dict[str, Any]]]


def _prefetched(delivery_ids: Sequence[int], now: datetime) -> _Prefetched:
    """The due deliveries' events and failure details when their body is not built yet. A message
    due only later is read again in the claim (its events may still grow)."""
    due = list(Delivery.objects.filter(id__in=list(delivery_ids), body="", done=False, not_before__lte=now,
                                       next_attempt_time__lte=now).values_list("id", flat=True))
    events = _events_of(due)
    return _Prefetched(events, _failure_details(events))


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


def deliver(delivery_id: int, *, now: datetime | None = None) -> Outcome:
    """Claim, send and record one delivery (:func:`deliver_many` of one)."""
    return deliver_many([delivery_id], now=now)[delivery_id]


def deliver_many(delivery_ids: Sequence[int], *, now: datetime | None = None,
                 token: str | None = None) -> dict[int, Outcome]:
    """Claim, send and record deliveries (idempotent; safe from any number of workers).

    One transaction claims the whole batch in a fixed number of queries (the
    rows, the circuit breakers, the events of first tries, one bulk update);
    the claimed messages are then sent outside it, up to
    ``XMC_NOTIFY_SEND_CONCURRENCY`` at a time, and the successes recorded in
    one statement. Each delivery's outcome is what :func:`deliver` says of it.

    ``token`` is the lease the caller holds the rows under (the deliver task's
    ``delivery.consume.consume_many``, ``delivery.leases.claim_many``): a
    claim of that token is ours, any other live claim another run's. The rows
    settled without a send (done, not due, suppressed, postponed) are released
    in the claim's transaction, so their own next task is not dropped under
    our claim while the rest of the batch is still being sent.
    """
    now = now or timezone.now()
    held, token = token is not None, token or uuid.uuid4().hex
    ids = sorted({int(i) for i in delivery_ids})
    outcomes: dict[int, Outcome] = {}
    built = _prefetched(ids, now)  # before the row locks: it may read the cluster
    with transaction.atomic():
        found = _claimable(ids, now)
        # Row-locked by another transaction right now, or no such delivery: not_claimed says which.
        outcomes.update(not_claimed(set(ids) - {f.delivery.id for f in found}, token=token, now=now))
        candidates = _checked(found, now, outcomes, token)
        claimed = _claim(candidates, now, outcomes, built, token)
        if held:
            sending = {c.delivery.id for c in claimed}
            leases.release_many(Delivery, [i for i in outcomes if i not in sending], token)
    _send_all(claimed)
    outcomes.update(_record_all(claimed))
    return outcomes


def not_claimed(delivery_ids: Iterable[int], *, token: str, now: datetime | None = None) -> dict[int, Outcome]:
    """What the deliveries a claim did not take say (one read): missing; done; leased by another live
    run (left to it: it records the try and schedules the next, and the sweep takes over if it
    dies); or row-locked by another transaction right now, looked at again in ``LOCKED_RETRY_S``.

    A lock is brief (another worker's claim, or the publisher recording that the broker took the
    message, which races the worker that already received it): look again soon rather than leave
    the message to the sweep, a lease and a sweep interval later."""
    ids = sorted(set(delivery_ids))
    if not ids:
        return {}
    now = now or timezone.now()
    rows = {i: (done, until, by) for i, done, until, by in Delivery.objects.filter(id__in=ids).values_list(
        "id", "done", "claimed_until", "claimed_by")}
    outcomes: dict[int, Outcome] = {}
    for i in ids:
        if i not in rows:
            outcomes[i] = Outcome("missing")
        elif rows[i][0]:
            outcomes[i] = Outcome("done")
        elif leases.held_elsewhere(rows[i][1], rows[i][2], now, token):
            outcomes[i] = Outcome("leased")
        else:
            outcomes[i] = Outcome("leased", LOCKED_RETRY_S)
    return outcomes


Candidate = tuple[_Claimable, channels.ChannelAdapter, str]


def _checked(found: Sequence[_Claimable], now: datetime, outcomes: dict[int, Outcome],
             token: str) -> list[Candidate]:
    """The deliveries to send now (with their adapter and breaker key); the others' outcomes go to
    ``outcomes``: done, leased (another run's live claim), not due, suppressed, or postponed
    (quiet hours, rate limit)."""
    readable: dict[tuple[int, int | None], bool] = {}
    in_batch: dict[int, int] = {}  # subscription -> messages claimed in this batch
    candidates: list[Candidate] = []
    for f in found:
        d, sub = f.delivery, f.delivery.subscription
        if d.done or d.status in (DeliveryStatus.DELIVERED, DeliveryStatus.DEAD, DeliveryStatus.SUPPRESSED):
            outcomes[d.id] = Outcome("done")
            continue
        if leases.held_elsewhere(d.claimed_until, d.claimed_by, now, token):
            outcomes[d.id] = Outcome("leased")  # another run is on it
            continue
        due = max(d.next_attempt_time, d.not_before)
        if due > now:
            outcomes[d.id] = Outcome("not_due", (due - now).total_seconds())
            continue
        if d.type != EventType.TEST:
            held = _held_back(f, now, readable, in_batch)
            if held is not None:
                outcomes[d.id] = held
                continue
        candidates.append((f, channels.adapter(sub), channels.breaker_key(sub)))
    return candidates


def _held_back(f: _Claimable, now: datetime, readable: dict[tuple[int, int | None], bool],
               in_batch: dict[int, int]) -> Outcome | None:
    """Why this (non-test) delivery is not sent now, or None: the subscription is disabled or may
    not read the experiment (suppressed), quiet hours or the rate limit (postponed)."""
    d, sub, experiment = f.delivery, f.delivery.subscription, f.experiment
    if not sub.enabled:
        return _suppress(d, "the subscription is disabled")
    key = (sub.id, d.xid)
    if key not in readable:
        readable[key] = fanout.may_read(sub, d.xid, experiment.acls if experiment else None)
    if not readable[key]:
        what = f"experiments/{d.xid}" if d.xid is not None else "staff events"
        who = f"group {sub.group}" if sub.group else sub.owner
        return _suppress(d, f"{who} may not read {what}")
    if d.attempts != 0:
        return None
    quiet = _in_quiet_hours(sub, now)
    if quiet:
        return _postpone(d, quiet, "quiet hours")
    limited = _rate_limited(sub, f.sent_last_hour + in_batch.get(sub.id, 0), f.first_sent_last_hour or now)
    if limited:
        return _postpone(d, limited, f"rate limit: {sub.rate_limit_per_hour} messages per hour")
    in_batch[sub.id] = in_batch.get(sub.id, 0) + 1
    return None


def _claim(candidates: Sequence[Candidate], now: datetime, outcomes: dict[int, Outcome],
           built: _Prefetched, token: str) -> list[_Claimed]:
    """Postpone those whose circuit is open; freeze the others' bodies at the first try (from
    what was prefetched, else read now), move them to DELIVERING under our lease (``token``)
    and count the try (one bulk update)."""
    opened: dict[str, datetime] = {
        endpoint: until for endpoint, until in EndpointHealth.objects.filter(
            endpoint__in=sorted({c[2] for c in candidates}), open_until__gt=now).values_list("endpoint", "open_until")
        if until is not None}
    bodies = [c[0] for c in candidates if c[2] not in opened and not c[0].delivery.body]
    late = _events_of([f.delivery.id for f in bodies if f.delivery.id not in built.events])
    events = {**built.events, **late}
    unit_details = {xid: dict(units) for xid, units in built.details.items()}
    for xid, units in _failure_details(late).items():
        unit_details.setdefault(xid, {}).update(units)
    claimed: list[_Claimed] = []
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
        d.claimed_until, d.claimed_by = now + timedelta(seconds=settings.XMC_NOTIFY_LEASE_S), token
        claimed.append(_Claimed(d, adapter, endpoint))
    Delivery.objects.bulk_update([c.delivery for c in claimed],
                                 ["status", "attempts", "claimed_until", "claimed_by", "body", "timestamp"])
    return claimed


def _send_one(c: _Claimed) -> None:
    started = time.monotonic()
    d = c.delivery
    try:
        c.result = c.adapter.send(d.subscription, d.message_id, d.body, left_out=d.left_out)
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
            _dead_letter(delivery_id, attempt, result, now)
        if delay is not None:
            outbox.after_commit(lambda: outbox.enqueue([delivery_id], countdown=delay))
    return outcome


def _dead_letter(delivery_id: int, attempt: int, result: channels.SendResult, now: datetime) -> None:
    """The one dead-letter record beside the actuator's and the outbox's, in the transaction that
    gives the delivery up: the operators' list shows it and sends it again (``send_again``)."""
    message_id = Delivery.objects.filter(id=delivery_id).values_list("message_id", flat=True).first()
    code = f"HTTP_{result.status_code}" if result.status_code else ("REFUSED" if not result.retryable else "UNAVAILABLE")
    wu_services.record_dead_letter(
        task_name=outbox.DELIVER_TASK, task_type="", payload=json.dumps({"delivery": delivery_id,
                                                                        "messageId": message_id}).encode(),
        operation_id=None, error_code=code, error_message=result.error or code, attempts=attempt,
        source=outbox.DEAD_LETTER_SOURCE, source_id=delivery_id, now=now)


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
