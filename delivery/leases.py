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
arrives after the claim expired takes the row over.
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
from django.db import connections
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


def claim(model: Table, pk: int, token: str, *, seconds: float | None = None) -> bool:
    """Take (or keep) the row for ``token`` until now + ``seconds`` (the lease).

    True when the row is not done and no *other* live claim holds it: the
    caller runs the task. False: done already, gone, or another worker's claim
    is live: the caller drops this copy.
    """
    now = timezone.now()
    until = now + (timedelta(seconds=seconds) if seconds is not None else lease())
    return bool(
        model._default_manager.filter(pk=pk, done=False)
        .filter(unclaimed(now) | Q(claimed_by=token))
        .update(claimed_until=until, claimed_by=token)
    )


def extend(model: Table, pk: int, token: str, *, seconds: float | None = None) -> bool:
    """Push our claim out to now + ``seconds`` (lease by default); False when it is no longer ours."""
    until = timezone.now() + (timedelta(seconds=seconds) if seconds is not None else lease())
    return bool(model._default_manager.filter(pk=pk, done=False, claimed_by=token).update(claimed_until=until))


def release(model: Table, pk: int, token: str) -> None:
    """Give our claim up (the run ended: done, or dead-lettered); a later copy is judged by ``done``."""
    model._default_manager.filter(pk=pk, claimed_by=token).update(claimed_until=None)


@contextmanager
def heartbeat(model: Table, pk: int, token: str) -> Iterator[None]:
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
