"""Celery tasks of the ``lifecycle`` queue: thin adapters around ``lifecycle.services``.

* ``xmc.lifecycle.handle_event(payload)``: one base64 ``ArtifactLifecycleEvent``;
* ``xmc.lifecycle.close_superseded(xid, wid, eid)``: after a restart.

Each message is an outbox row (``workunits.delivery``, keyword
``delivery_id``): the worker claims it (a second copy is dropped), and the
sweep re-sends it if it was lost or its worker died. Both are idempotent
(rules re-read the run and never move a phase backwards), acknowledged
late, and retried with exponential backoff on errors of the external
service or the database; after the last try the row is dead-lettered
(admin, beside the actuator's). A malformed payload is logged and dropped
(retrying cannot fix it). The worker checks the lifecycle configuration at
start-up.
"""
from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_init
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from core.queues import Queue
from delivery import declare
from lifecycle import events, rules, services
from lifecycle.mlrun_client import MLRunError
from workunits import delivery

log = logging.getLogger(__name__)

RETRY: dict[str, Any] = {
    "bind": True,
    "queue": Queue.LIFECYCLE,
    # A few external round trips with polled operations (client timeouts 15 s per
    # call, 45 s per operation); a task cut short is retried, not lost.
    "time_limit": 150,
}
#: What is retried (with exponential backoff and jitter, up to MAX_RETRIES), then dead-lettered.
RETRY_FOR = (MLRunError, DatabaseError, SoftTimeLimitExceeded)
MAX_RETRIES = 50


@declare.task(name=events.TASK_NAME, **RETRY)
def handle_event(self: Any, payload: str, delivery_id: int | None = None) -> None:
    try:
        event = events.decode(payload)
    except ValueError as exc:
        log.error("lifecycle.event.malformed", extra={"error": str(exc)})
        if delivery_id is not None:
            delivery.dead_letter(delivery_id, events.TASK_NAME, "INVALID_ARGUMENT", str(exc), 1)
        return
    delivery.consume(self, delivery_id, lambda: services.handle_event(event), retry_for=RETRY_FOR,
                     max_retries=MAX_RETRIES)


@declare.task(name=services.CLOSE_SUPERSEDED_TASK, **RETRY)
def close_superseded(self: Any, xid: int, wid: int, eid: int, delivery_id: int | None = None) -> None:
    delivery.consume(self, delivery_id, lambda: services.close_superseded(int(xid), int(wid), int(eid)),
                     retry_for=RETRY_FOR, max_retries=MAX_RETRIES)


@worker_init.connect
def _check_configuration(**kwargs: Any) -> None:
    """A worker with the flag on but no MachineLearningRun project/location refuses to start."""
    try:
        rules.check_configuration()
    except ImproperlyConfigured as exc:
        log.critical("lifecycle.configuration_error: %s", exc)
        raise SystemExit(f"lifecycle: {exc}") from exc  # Celery logs and swallows ordinary exceptions here
