"""Leased delivery: the one mechanism for everything that crosses the broker.

The broker is a doorbell, the database the truth. Whatever a worker must do
is a row first (an ``Operation`` for the actuator, an ``OutboxMessage`` for
every other queue: lifecycle events, superseded-run closes, resumption
runs, and any later queue); the message on Redis only says "look at row N".
A row is *due* for a (re-)send while it is not done and either

* it never reached the broker (``dispatched_time`` is null) and is older
  than ``XMC_OUTBOX_SWEEP_MIN_AGE_S`` (the request path's after-commit send
  failed or the process died before it), or
* its last send is older than the lease (``XMC_OPERATION_LEASE_S``) and no
  worker holds a live claim (``claimed_until`` null or past): the message
  was lost (Redis restarted empty), or the worker that took it died.

The worker that takes a task **claims** the row (:func:`claim`: one
conditional UPDATE, ``claimed_until = now + lease``, ``claimed_by`` = its
Celery task id, which a Celery retry keeps) and extends the claim while it
works (:func:`heartbeat`, and before a retry's countdown: :func:`extend`).
A second copy of the task finds the claim live and is dropped; a copy that
arrives after the claim expired takes the row over. Finishing is one
``UPDATE ... WHERE done = false``: only one run ever ends a row. Handlers
are idempotent on top of that (they re-read the world), so a takeover of
work that was half done is safe.

The Redis visibility timeout no longer carries correctness: it only decides
when Redis itself hands an unacknowledged message back, which is by then a
duplicate the claim check drops.

This module holds the lease rules shared by both tables and the generic
outbox of ``OutboxMessage`` (:func:`enqueue`, :func:`send`,
:func:`sweep_messages`, :func:`consume`); the Operation-specific sending is
``workunits.outbox``. See docs/architecture/delivery.md.
"""
from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import connections, transaction
from django.db.models import F, Min, Q, QuerySet
from django.utils import timezone

from core.queues import Queue
from workunits.choices import TaskType
from workunits.models import DeadLetter, Operation, OutboxMessage, SchedulingSwitch

log = logging.getLogger(__name__)

#: The tables whose rows are leased (each has dispatched_time, claimed_until, claimed_by, done).
Leased = type[Operation] | type[OutboxMessage]

#: kombu's publish retry: a few quick tries, then the row waits for the sweep.
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.4, "interval_max": 1.0}


def lease() -> timedelta:
    return timedelta(seconds=settings.XMC_OPERATION_LEASE_S)


# --- Leases ---------------------------------------------------------------------------------


def due(now: datetime) -> Q:
    """The rows a sweep must (re-)send (add ``done=False`` and the table's own filters)."""
    never_sent = Q(dispatched_time__isnull=True,
                   create_time__lt=now - timedelta(seconds=settings.XMC_OUTBOX_SWEEP_MIN_AGE_S))
    lost = Q(dispatched_time__lt=now - lease()) & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
    return never_sent | lost


def token_of(celery_task: Any) -> str:
    """What a claim is held under: the Celery task id (the same across the task's own retries)."""
    request = getattr(celery_task, "request", None)
    return str(getattr(request, "id", None) or uuid.uuid4())


def claim(model: Leased, pk: int, token: str, *, seconds: float | None = None) -> bool:
    """Take (or keep) the row for ``token`` until now + ``seconds`` (the lease).

    True when the row is not done and no *other* live claim holds it: the
    caller runs the task. False: done already, gone, or another worker's claim
    is live: the caller drops this copy.
    """
    now = timezone.now()
    until = now + (timedelta(seconds=seconds) if seconds is not None else lease())
    return bool(
        model.objects.filter(id=pk, done=False)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now) | Q(claimed_by=token))
        .update(claimed_until=until, claimed_by=token)
    )


def extend(model: Leased, pk: int, token: str, *, seconds: float | None = None) -> bool:
    """Push our claim out to now + ``seconds`` (lease by default); False when it is no longer ours."""
    until = timezone.now() + (timedelta(seconds=seconds) if seconds is not None else lease())
    return bool(model.objects.filter(id=pk, done=False, claimed_by=token).update(claimed_until=until))


def release(model: Leased, pk: int, token: str) -> None:
    """Give our claim up (the run ended: done, or dead-lettered); a later copy is judged by ``done``."""
    model.objects.filter(id=pk, claimed_by=token).update(claimed_until=None)


@contextmanager
def heartbeat(model: Leased, pk: int, token: str) -> Iterator[None]:
    """Keep our claim alive (every third of the lease) while the body runs.

    The heartbeat runs on its own thread with its own database connection
    (closed when it stops), so a handler blocked on a slow cluster call keeps
    its row; a worker that dies stops extending, and the claim runs out.
    """
    stop = threading.Event()
    interval = max(0.2, settings.XMC_OPERATION_LEASE_S / 3)

    def beat() -> None:
        try:
            while not stop.wait(interval):
                try:
                    extend(model, pk, token)
                except Exception:
                    log.warning("delivery.heartbeat_failed", extra={"table": model.__name__, "id": pk}, exc_info=True)
        finally:
            connections.close_all()  # this thread's connections only

    thread = threading.Thread(target=beat, name=f"lease-{model.__name__}-{pk}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def mark_sent(model: Leased, ids: Sequence[int], *, now: datetime | None = None) -> int:
    """The broker took these rows' messages (again): their lease starts now."""
    if not ids:
        return 0
    now = now or timezone.now()
    return int(model.objects.filter(id__in=list(ids), done=False).update(
        dispatched_time=now, dispatch_attempts=F("dispatch_attempts") + 1))


# --- How far behind the workers are ---------------------------------------------------------


def oldest_pending(now: datetime | None = None) -> dict[str, float]:
    """Per queue, the age in seconds of its oldest row no worker is on (0 when there is none)."""
    now = now or timezone.now()
    return {queue: max(0.0, (now - since).total_seconds()) if since is not None else 0.0
            for queue, since in oldest_pending_since(now).items()}


def oldest_pending_since(now: datetime | None = None) -> dict[str, datetime | None]:
    """Per queue, the create time of its oldest row no worker is on (None when there is none).

    A row counts while it is not done and no live claim holds it: a task a
    worker is retrying, or a Restart waiting for the old JobSet, is being
    worked on; a row nobody took (every worker dead, frozen or busy) ages.
    Operations are the ``actuator`` queue; while scheduling is paused the
    held Creates, Restarts and Updates wait on purpose and do not count
    (as in ``workunits.outbox.due_operations``). Read by the gauge
    ``xmc_delivery_oldest_pending_seconds`` and ``/readyz`` (``xmc.ops``) and
    the pages' banner (``ui.context``); see docs/architecture/delivery.md.
    """
    now = now or timezone.now()
    since: dict[str, datetime | None] = {queue.value: None for queue in Queue}
    unclaimed = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    ops = Operation.objects.filter(done=False).exclude(task_type="").filter(unclaimed)
    if SchedulingSwitch.objects.filter(id=1, paused=True).exists():
        ops = ops.filter(Q(dispatched_time__isnull=True) | Q(task_type=TaskType.DELETE))
    since[Queue.ACTUATOR.value] = ops.aggregate(oldest=Min("create_time"))["oldest"]
    messages = (OutboxMessage.objects.filter(done=False).filter(unclaimed).values("queue")
                .annotate(oldest=Min("create_time")).values_list("queue", "oldest"))
    for queue, first in messages:
        known = since.get(queue)
        since[queue] = first if known is None else min(known, first)
    return since


# --- The generic outbox (OutboxMessage) -----------------------------------------------------


def enqueue(queue: str, task_name: str, args: Sequence[Any], *, committed: bool = False) -> OutboxMessage:
    """Record a message for ``queue`` and send it once the current transaction commits.

    Inside a transaction the row commits with it (the message carries that
    transaction's outcome, and is sent only if it committed). ``committed``:
    the caller runs after its own commit (the reconciler's hooks), so the
    row is written and sent at once. A send that fails is left to the
    sweep: the row is the truth.
    """
    message = OutboxMessage.objects.create(queue=queue, task_name=task_name, args=list(args),
                                           create_time=timezone.now())
    if committed:
        send_safely([message])
    else:
        transaction.on_commit(lambda: send_safely([message]))
    return message


def send_safely(messages: Sequence[OutboxMessage]) -> None:
    try:
        send(messages)
    except Exception:
        log.exception("delivery.send_failed", extra={"ids": [m.id for m in messages]})


def send(messages: Sequence[OutboxMessage]) -> int:
    """Publish each message (task ``task_name``, its ``args``, keyword ``delivery_id``); how many left."""
    app = current_app

    sent: list[int] = []
    with app.producer_or_acquire() as producer:
        for m in messages:
            if m.done:
                continue
            try:
                app.send_task(m.task_name, args=list(m.args), kwargs={"delivery_id": m.id}, queue=m.queue,
                              retry=True, retry_policy=PUBLISH_RETRY_POLICY, producer=producer,
                              ignore_result=True, declare=[])
            except Exception as exc:
                OutboxMessage.objects.filter(id=m.id).update(dispatch_attempts=F("dispatch_attempts") + 1)
                log.warning("delivery.publish_failed", extra={"id": m.id, "task": m.task_name, "error": str(exc)})
                continue
            sent.append(m.id)
    mark_sent(OutboxMessage, sent)
    return len(sent)


def due_messages(now: datetime | None = None) -> QuerySet[OutboxMessage]:
    return OutboxMessage.objects.filter(done=False).filter(due(now or timezone.now())).order_by("create_time")


def sweep_messages(*, limit: int = 1000) -> int:
    """Re-send every due message (beat: ``xmc.delivery.sweep``); how many were due."""
    rows = list(due_messages()[:limit])
    if rows:
        send(rows)
    return len(rows)


def finish(pk: int, *, error: str = "") -> bool:
    """End the message exactly once (one ``UPDATE ... WHERE done = false``)."""
    return bool(OutboxMessage.objects.filter(id=pk, done=False).update(
        done=True, end_time=timezone.now(), error=error[:10_000], claimed_until=None))


def purge_messages(*, older_than: datetime) -> int:
    deleted, _ = OutboxMessage.objects.filter(done=True, end_time__lt=older_than).delete()
    return int(deleted)


def jittered_backoff(retries: int, *, base: float = 1.0, cap: float = 300.0) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^retries)]."""
    import random

    return random.uniform(0, min(cap, base * (2.0 ** retries)))


def consume(
    celery_task: Any,
    delivery_id: int | None,
    run: Callable[[], None],
    *,
    retry_for: tuple[type[BaseException], ...],
    max_retries: int,
    backoff: Callable[[int], float] = jittered_backoff,
) -> None:
    """Run one message's work at most once in effect: claim, heartbeat, retry, finish or dead-letter.

    ``delivery_id`` is the OutboxMessage the task stands for (None: a message
    sent before this mechanism: run and retried the same way, without a
    claim). A copy whose row is done or claimed by another live run returns
    at once. An exception in ``retry_for`` is retried (a Celery retry keeps
    the task id, so the claim stays ours; it is extended past the countdown)
    up to ``max_retries``; after the last try, or on any other exception, the
    row is finished with the error and a DeadLetter row (linked to the
    message) is written.
    """
    token = token_of(celery_task)
    if delivery_id is not None:
        if not claim(OutboxMessage, delivery_id, token):
            log.info("delivery.duplicate_dropped", extra={"id": delivery_id, "task": celery_task.name})
            return
        OutboxMessage.objects.filter(id=delivery_id).update(attempts=F("attempts") + 1)
    retries = int(getattr(celery_task.request, "retries", 0) or 0)
    try:
        if delivery_id is None:
            run()
        else:
            with heartbeat(OutboxMessage, delivery_id, token):
                run()
    except retry_for as exc:
        if retries < max_retries:
            countdown = backoff(retries)
            if delivery_id is not None:
                extend(OutboxMessage, delivery_id, token, seconds=countdown + settings.XMC_OPERATION_LEASE_S)
            log.warning("delivery.retry", extra={"id": delivery_id, "task": celery_task.name, "error": str(exc),
                                                 "countdown": countdown})
            raise celery_task.retry(exc=exc, countdown=countdown, max_retries=max_retries) from exc
        dead_letter(delivery_id, celery_task.name, "DEADLINE_EXCEEDED", f"{type(exc).__name__}: {exc}", retries + 1)
        return
    except Exception as exc:
        if type(exc).__module__.startswith("celery."):
            raise  # Retry / Reject / Ignore: Celery's own control flow
        dead_letter(delivery_id, celery_task.name, "INTERNAL", f"{type(exc).__name__}: {exc}", retries + 1)
        return
    if delivery_id is not None:
        finish(delivery_id)


def dead_letter(delivery_id: int | None, task_name: str, code: str, message: str, attempts: int) -> None:
    """The message ran out of tries: finish it with the error and keep a DeadLetter beside the actuator's."""
    import json

    log.error("delivery.dead_letter", extra={"id": delivery_id, "task": task_name, "code": code, "error": message})
    row = OutboxMessage.objects.filter(id=delivery_id).values("args").first() if delivery_id is not None else None
    payload = json.dumps(row["args"] if row else []).encode()
    with transaction.atomic():
        if row is not None and delivery_id is not None:
            finish(delivery_id, error=message)
        DeadLetter.objects.create(task_name=task_name, task_type="", payload=payload,
                                  message_id=delivery_id if row is not None else None, error_code=code,
                                  error_message=message[:10_000], attempts=attempts, created_time=timezone.now())


def requeue_message(delivery_id: int) -> OutboxMessage:
    """Open a finished message again and send it after commit (the admin's re-queue)."""
    with transaction.atomic():
        m = OutboxMessage.objects.select_for_update().get(id=delivery_id)
        m.done, m.end_time, m.error, m.dispatched_time, m.claimed_until, m.claimed_by = False, None, "", None, None, ""
        m.save(update_fields=["done", "end_time", "error", "dispatched_time", "claimed_until", "claimed_by"])
        transaction.on_commit(lambda: send_safely([m]))
        return m

