"""Claim / extend / release: the lease rules of every :class:`delivery.models.Leased` table.

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
arrives after the claim expired takes the row over. A task that stands for
a batch of rows claims them in one statement (:func:`claim_many`) and
extends and releases them together (:func:`extend_many`,
:func:`release_many`).
"""
from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from delivery.models import Leased

log = logging.getLogger(__name__)

Table = type[Leased]


def lease() -> timedelta:
    return timedelta(seconds=settings.XMC_OPERATION_LEASE_S)


def due(now: datetime) -> Q:
    """The rows a sweep must (re-)send (add ``done=False`` and the table's own filters)."""
    never_sent = Q(dispatched_time__isnull=True,
                   create_time__lt=now - timedelta(seconds=settings.XMC_OUTBOX_SWEEP_MIN_AGE_S))
    lost = Q(dispatched_time__lt=now - lease()) & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
    return never_sent | lost


def unclaimed(now: datetime) -> Q:
    """No live claim holds the row."""
    return Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)


def token_of(celery_task: Any) -> str:
    """What a claim is held under: the Celery task id (the same across the task's own retries)."""
    request = getattr(celery_task, "request", None)
    return str(getattr(request, "id", None) or uuid.uuid4())


def _until(seconds: float | None, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) + (timedelta(seconds=seconds) if seconds is not None else lease())


def claim(model: Table, pk: int, token: str, *, seconds: float | None = None) -> bool:
    """Take (or keep) the row for ``token`` until now + ``seconds`` (the lease).

    True when the row is not done and no *other* live claim holds it: the
    caller runs the task. False: done already, gone, or another worker's claim
    is live: the caller drops this copy. A row another transaction holds
    locked is waited for (one row: the wait is short and cannot cycle).
    """
    now = timezone.now()
    return bool(
        model._default_manager.filter(pk=pk, done=False)
        .filter(unclaimed(now) | Q(claimed_by=token))
        .update(claimed_until=_until(seconds, now), claimed_by=token)
    )


def claim_many(model: Table, ids: Sequence[int], token: str, *, seconds: float | None = None,
               extra: Q | None = None) -> list[int]:
    """:func:`claim` for a batch, in one statement: the ids taken for ``token`` (sorted).

    The same rules (not done; unclaimed, or claimed by ``token`` already) and
    the table's own ``extra`` filter, in one conditional
    ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING id``.
    A row another transaction holds locked right now is *skipped*, not
    waited for: two batches claiming overlapping rows never wait on each
    other (no lock cycle), and the caller can tell such a row from one under
    a live claim by reading it (it is unclaimed and not done).
    """
    wanted = sorted({int(i) for i in ids})
    if not wanted:
        return []
    now = timezone.now()
    manager = model._default_manager
    rows = (manager.filter(pk__in=wanted, done=False).filter(unclaimed(now) | Q(claimed_by=token))
            .filter(extra if extra is not None else Q()).order_by("pk").select_for_update(skip_locked=True))
    table, pk = model._meta.db_table, model._meta.pk.column
    with transaction.atomic(using=manager.db, savepoint=False), connections[manager.db].cursor() as cursor:
        select, params = rows.values("pk").query.get_compiler(using=manager.db).as_sql()
        cursor.execute(f'UPDATE "{table}" SET claimed_until = %s, claimed_by = %s '
                       f'WHERE "{pk}" IN ({select}) RETURNING "{pk}"', [_until(seconds, now), token, *params])
        return sorted(int(row[0]) for row in cursor.fetchall())


#: Seconds before a row that :func:`claim_many` skipped because another transaction held it locked is
#: looked at again: such a lock is brief (another worker's claim, or the publisher recording that the
#: broker took the message, which races the worker that already received it), so look again soon
#: rather than leave the message to the sweep, a lease and a sweep interval later.
LOCKED_RETRY_S = 1.0


def held_elsewhere(claimed_until: datetime | None, claimed_by: str, now: datetime, token: str) -> bool:
    """A row read already is under another run's live claim (the rule :func:`unclaimed` states in SQL)."""
    return claimed_until is not None and claimed_until > now and claimed_by != token


def locked_out(model: Table, ids: Sequence[int], token: str) -> list[int]:
    """Of rows a claim did not take, those it skipped only because they were row-locked: not done and
    under no live claim of another run (gone, done and held rows are left alone). One read."""
    if not ids:
        return []
    now = timezone.now()
    return sorted(int(i) for i in model._default_manager.filter(pk__in=list(ids), done=False)
                  .filter(unclaimed(now) | Q(claimed_by=token)).values_list("pk", flat=True))


def extend(model: Table, pk: int, token: str, *, seconds: float | None = None) -> bool:
    """Push our claim out to now + ``seconds`` (lease by default); False when it is no longer ours."""
    return bool(extend_many(model, [pk], token, seconds=seconds))


def extend_many(model: Table, ids: Sequence[int], token: str, *, seconds: float | None = None) -> int:
    """:func:`extend` for a batch, in one statement; how many claims were still ours.

    A claim we released meanwhile (``claimed_until`` null: the row was
    settled while the rest of the batch still runs) stays released.
    """
    if not ids:
        return 0
    return int(model._default_manager.filter(pk__in=list(ids), done=False, claimed_by=token,
                                              claimed_until__isnull=False)
               .update(claimed_until=_until(seconds)))


def release(model: Table, pk: int, token: str) -> None:
    """Give our claim up (the run ended: done, or dead-lettered); a later copy is judged by ``done``."""
    release_many(model, [pk], token)


def release_many(model: Table, ids: Sequence[int], token: str) -> int:
    """:func:`release` for a batch, in one statement; how many claims were still ours (a row the run
    already released, or finished with its claim cleared, is not written again)."""
    if not ids:
        return 0
    return int(model._default_manager.filter(pk__in=list(ids), claimed_by=token, claimed_until__isnull=False)
               .update(claimed_until=None))


@contextmanager
def heartbeat(model: Table, pk: int | Sequence[int], token: str, *, seconds: float | None = None) -> Iterator[None]:
    """Keep our claim of one row, or of a batch, alive (every third of the lease) while the body runs.

    The heartbeat runs on its own thread with its own database connection
    (closed when it stops), so a handler blocked on a slow cluster call keeps
    its row; a worker that dies stops extending, and the claim runs out.
    ``seconds`` is the lease (``XMC_OPERATION_LEASE_S`` by default).
    """
    ids = [pk] if isinstance(pk, int) else list(pk)
    stop = threading.Event()
    interval = max(0.2, (seconds if seconds is not None else settings.XMC_OPERATION_LEASE_S) / 3)

    def beat() -> None:
        try:
            while not stop.wait(interval):
                try:
                    extend_many(model, ids, token, seconds=seconds)
                except Exception:
                    log.warning("delivery.heartbeat_failed", extra={"table": model.__name__, "ids": ids[:20]},
                                exc_info=True)
        finally:
            connections.close_all()  # this thread's connections only

    thread = threading.Thread(target=beat, name=f"lease-{model.__name__}-{ids[0] if ids else '-'}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def mark_sent(model: Table, ids: Sequence[int], *, now: datetime | None = None) -> int:
    """The broker took these rows' messages (again): their lease starts now."""
    if not ids:
        return 0
    now = now or timezone.now()
    return int(model._default_manager.filter(pk__in=list(ids), done=False).update(
        dispatched_time=now, dispatch_attempts=F("dispatch_attempts") + 1))


def count_failed_publish(model: Table, pk: int) -> int:
    """A publish of this row failed: counted on it (the sweep tries again); the new count."""
    model._default_manager.filter(pk=pk).update(dispatch_attempts=F("dispatch_attempts") + 1)
    return int(model._default_manager.filter(pk=pk).values_list("dispatch_attempts", flat=True).first() or 0)
