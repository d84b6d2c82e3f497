"""Celery tasks of the actuator (found by ``app.autodiscover_tasks``).

Thin adapters: each takes one argument, the base64 text of a signed
``xmc.internal.v1.Task`` (``workunits.outbox.publish``), and calls
``k8s_bridge.actuator.runner.run``. The sweeps run under ``celery -A xmc beat``
(schedule in ``xmc/celery.py``).
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

from django.conf import settings
from django.utils import timezone

from core import task_wire
from core.protos import task_pb2
from k8s_bridge.actuator import runner
from k8s_bridge.logs import archive
from workunits import services
from xmc.celery import Queue, app

def _task(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``app.task`` with a type (Celery ships none)."""
    return cast("Callable[[Callable[..., Any]], Any]", app.task(**options))


_OPTIONS: dict[str, Any] = {
    "bind": True,
    "queue": Queue.ACTUATOR.value,
    "acks_late": True,  # idempotent by design: every handler re-reads the world
    "ignore_result": True,
    "soft_time_limit": settings.XMC_ACTUATOR_SOFT_TIME_LIMIT_S,
    "time_limit": settings.XMC_ACTUATOR_SOFT_TIME_LIMIT_S + 30,
}


@_task(name=task_wire.ACTUATOR_TASK_NAMES[task_pb2.Task.CREATE], **_OPTIONS)
def create(self: Any, payload: str) -> None:
    runner.run(self, payload, task_pb2.Task.CREATE)


@_task(name=task_wire.ACTUATOR_TASK_NAMES[task_pb2.Task.DELETE], **_OPTIONS)
def delete(self: Any, payload: str) -> None:
    runner.run(self, payload, task_pb2.Task.DELETE)


@_task(name=task_wire.ACTUATOR_TASK_NAMES[task_pb2.Task.RESTART], **_OPTIONS)
def restart(self: Any, payload: str) -> None:
    runner.run(self, payload, task_pb2.Task.RESTART)


@_task(name=task_wire.ACTUATOR_TASK_NAMES[task_pb2.Task.UPDATE], **_OPTIONS)
def update(self: Any, payload: str) -> None:
    runner.run(self, payload, task_pb2.Task.UPDATE)


@_task(name="xmc.logs.purge_archive", queue=Queue.ACTUATOR.value, ignore_result=True)
def purge_log_archive() -> int:
    """Delete archived pod logs ``XMC_LOG_ARCHIVE_RETENTION_DAYS`` after they were archived (0: keep)."""
    if settings.XMC_LOG_ARCHIVE_RETENTION_DAYS <= 0:
        return 0
    return archive.purge(older_than=timezone.now() - timedelta(days=settings.XMC_LOG_ARCHIVE_RETENTION_DAYS))


@_task(name="xmc.actuator.purge_operations", queue=Queue.ACTUATOR.value, ignore_result=True)
def purge_operations() -> int:
    """Delete done operations ``XMC_OPERATION_RETENTION_DAYS`` after their end time."""
    cutoff = timezone.now() - timedelta(days=settings.XMC_OPERATION_RETENTION_DAYS)
    return services.purge_done_operations(older_than=cutoff)
