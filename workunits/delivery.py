"""The outbox of every queue but the actuator's: ``OutboxMessage`` rows on the delivery floor.

The broker is a doorbell, the database the truth. Whatever a worker must do
is a row first (an ``Operation`` for the actuator, ``workunits.outbox``; an
``OutboxMessage`` for every other queue: lifecycle events, superseded-run
closes, resumption runs, and any later queue); the message on Redis only
says "look at row N". The lease rules (due, claim, extend, release,
heartbeat), the publish, the backoff, the worker side and the sweep are the
``delivery`` app's (``delivery.leases``, ``delivery.broker``,
``delivery.backoff``, ``delivery.consume``, ``delivery.sweep``); this module
is what is particular to the ``OutboxMessage`` table: :func:`enqueue` (the
public way to send any new queue's work), :func:`send`,
:func:`sweep_messages`, :func:`consume`, :func:`dead_letter` and
:func:`requeue_message`. See docs/architecture/delivery.md.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F, Min, Q, QuerySet
from django.utils import timezone

from core.queues import Queue
from delivery import backoff as backoffs
from delivery import broker, leases
from delivery.consume import Retry
from delivery.consume import consume as consume_row
from workunits.choices import TaskType
from workunits.models import DeadLetter, Operation, OutboxMessage, SchedulingSwitch

log = logging.getLogger(__name__)


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
    unclaimed = leases.unclaimed(now)
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
    sent: list[int] = []
    with broker.producer() as producer:
        for m in messages:
            if m.done:
                continue
            try:
                broker.publish(m.task_name, m.args, kwargs={"delivery_id": m.id}, queue=m.queue, producer=producer)
            except Exception as exc:
                leases.count_failed_publish(OutboxMessage, m.id)
                log.warning("delivery.publish_failed", extra={"id": m.id, "task": m.task_name, "error": str(exc)})
                continue
            sent.append(m.id)
    leases.mark_sent(OutboxMessage, sent)
    return len(sent)


def due_messages(now: datetime | None = None) -> QuerySet[OutboxMessage]:
    return OutboxMessage.objects.filter(done=False).filter(leases.due(now or timezone.now())).order_by("create_time")


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


def jittered_backoff(retries: int) -> float:
    """The default backoff of a message's retries (``delivery.backoff.jittered``, 1 s doubling to 5 min)."""
    return backoffs.jittered(retries, base=1.0, cap=300.0)


def consume(
    celery_task: Any,
    delivery_id: int | None,
    run: Callable[[], None],
    *,
    retry_for: tuple[type[BaseException], ...],
    max_retries: int,
    backoff: Callable[[int], float] = jittered_backoff,
) -> None:
    """Run one message's work at most once in effect (``delivery.consume.consume`` on this table).

    ``delivery_id`` is the OutboxMessage the task stands for (None: a message
    sent before this mechanism: run and retried the same way, without a
    claim). An exception in ``retry_for`` is retried up to ``max_retries``
    with ``backoff``; after the last try, or on any other exception, the
    row is finished with the error and a DeadLetter row (linked to the
    message) is written.
    """
    def counted() -> None:
        if delivery_id is not None:
            OutboxMessage.objects.filter(id=delivery_id).update(attempts=F("attempts") + 1)
        run()

    def retry_in(exc: Exception, retries: int) -> Retry | None:
        return Retry(backoff(retries), max_retries) if isinstance(exc, retry_for) else None

    def give_up(exc: Exception, attempts: int) -> None:
        code = "DEADLINE_EXCEEDED" if isinstance(exc, retry_for) else "INTERNAL"
        dead_letter(delivery_id, celery_task.name, code, f"{type(exc).__name__}: {exc}", attempts)

    consume_row(celery_task, OutboxMessage if delivery_id is not None else None, delivery_id, counted,
                retry_in=retry_in, give_up=give_up,
                finish=(lambda: finish(delivery_id)) if delivery_id is not None else None)


def dead_letter(delivery_id: int | None, task_name: str, code: str, message: str, attempts: int) -> None:
    """The message ran out of tries: finish it with the error and keep a DeadLetter beside the actuator's."""
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

