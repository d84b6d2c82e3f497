"""Celery tasks of the actuator (found by ``app.autodiscover_tasks``).

Thin adapters: each takes one argument, the base64 text of a signed
``xmc.internal.v1.Task`` (``workunits.outbox.publish``), and calls
``k8s_bridge.actuator.runner.run``. The sweeps run under ``celery -A xmc beat``
(schedule in ``xmc/celery.py``).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from core import task_wire
from core.protos import task_pb2
from core.queues import Queue
from delivery import declare
from k8s_bridge.actuator import runner
from k8s_bridge.logs import archive
from workunits import services

_OPTIONS: dict[str, Any] = {
    "bind": True,
    "queue": Queue.ACTUATOR,
    "time_limit": settings.XMC_ACTUATOR_SOFT_TIME_LIMIT_S,
}
#: The clean-ups: a batch of deletes.
_PURGE: dict[str, Any] = {"queue": Queue.ACTUATOR, "time_limit": 60}


@declare.task(name=task_wire.ACTUATOR_TASK_NAMES[task_pb2.Task.CREATE], **_OPTIONS)
def create(self: Any, payload: str) -> None:
    runner.run(self, payload, task_pb2.Task.CREATE)


@declare.task(name=task_wire.ACTUATOR_TASK_NAMES[task_pb2.Task.DELETE], **_OPTIONS)
def delete(self: Any, payload: str) -> None:
    runner.run(self, payload, task_pb2.Task.DELETE)


@declare.task(name=task_wire.ACTUATOR_TASK_NAMES[task_pb2.Task.RESTART], **_OPTIONS)
def restart(self: Any, payload: str) -> None:
    runner.run(self, payload, task_pb2.Task.RESTART)


@declare.task(name=task_wire.ACTUATOR_TASK_NAMES[task_pb2.Task.UPDATE], **_OPTIONS)
def update(self: Any, payload: str) -> None:
    runner.run(self, payload, task_pb2.Task.UPDATE)


@declare.task(name="xmc.logs.purge_archive", **_PURGE)
def purge_log_archive() -> int:
    """Delete archived pod logs ``XMC_LOG_ARCHIVE_RETENTION_DAYS`` after they were archived (0: keep)."""
    if settings.XMC_LOG_ARCHIVE_RETENTION_DAYS <= 0:
        return 0
    return archive.purge(older_than=timezone.now() - timedelta(days=settings.XMC_LOG_ARCHIVE_RETENTION_DAYS))


@declare.task(name="xmc.actuator.purge_operations", **_PURGE)
def purge_operations() -> int:
    """Delete done operations ``XMC_OPERATION_RETENTION_DAYS`` after their end time."""
    cutoff = timezone.now() - timedelta(days=settings.XMC_OPERATION_RETENTION_DAYS)
    return services.purge_done_operations(older_than=cutoff)
