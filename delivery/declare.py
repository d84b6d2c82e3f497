"""The one way a Celery task is declared: ``@declare.task(name=..., queue=..., time_limit=...)``.

Every production task goes through `task` (tests/architecture/test_tasks.py
fails on a ``shared_task`` or ``app.task`` anywhere else, and on a registered
task without a time limit). What it gives every task:

* **its name and queue**, said where it is declared (the queue a member of
  ``core.queues.Queue``; ``None`` only for ``xmc.ping``, sent to whichever
  queue is probed);
* **a time limit**: ``time_limit`` is the soft limit (``SoftTimeLimitExceeded``
  is raised in the task, which may retry), the hard one `HARD_AFTER_S` later
  unless ``hard_time_limit`` says otherwise;
* **retries**: ``retry_for`` exceptions are retried by Celery with
  exponential backoff and jitter (capped at ``backoff_max`` s), at most
  ``max_retries`` times. Tasks that stand for a row retry through
  ``delivery.consume`` instead (its own backoff and dead letter), so they
  pass none of these. Every task is acknowledged late (its work is
  idempotent: a worker that dies mid-task gives the message back);
* **logging and metrics**: one ``celery.task`` log line per run (task, id,
  state, duration, retries) and ``xmc_celery_tasks_total{task,state}`` /
  ``xmc_celery_task_duration_seconds{task}`` (`Task`); served by each
  worker's ``/metrics`` (``xmc.ops.serve_metrics``).

Results are never stored (``ignore_result``): nothing reads them.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

import celery
from celery import shared_task
from celery.exceptions import Ignore, Reject, Retry
from prometheus_client import Counter, Histogram

from core.queues import Queue


#: The hard limit's distance past the soft one, unless a task says otherwise.
HARD_AFTER_S = 30

log = logging.getLogger("xmc.task")

TASKS = Counter(
    "xmc_celery_tasks",
    "Celery tasks finished in this worker, by task name and final state (SUCCESS, RETRY, FAILURE, ...).",
    ["task", "state"],
)
TASK_LATENCY = Histogram(
    "xmc_celery_task_duration_seconds",
    "Wall time of one Celery task run.",
    ["task"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 90.0),
)


def _state_of(exc: BaseException | None) -> str:
    if exc is None:
        return "SUCCESS"
    if isinstance(exc, Retry):
        return "RETRY"
    if isinstance(exc, Ignore):
        return "IGNORED"
    if isinstance(exc, Reject):
        return "REJECTED"
    return "FAILURE"


class Task(celery.Task):
    """The base of every task `task` declares: one log line and the two metrics per run."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        failed: BaseException | None = None
        try:
            return super().__call__(*args, **kwargs)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            seconds = time.perf_counter() - started
            state = _state_of(failed)
            TASKS.labels(self.name, state).inc()
            TASK_LATENCY.labels(self.name).observe(seconds)
            log.info("celery.task", extra={
                "task": self.name, "task_id": getattr(self.request, "id", None), "state": state,
                "duration_ms": round(seconds * 1000, 1), "retries": getattr(self.request, "retries", 0)})


def task(*, name: str, queue: Queue | str | None, time_limit: float, hard_time_limit: float | None = None,
         bind: bool = False, retry_for: tuple[type[BaseException], ...] = (),
         max_retries: int | None = None, backoff_max: float = 60) -> Callable[[Callable[..., Any]], Any]:
    """Declare a Celery task (see the module's docstring); the function stays callable as before."""
    if time_limit <= 0:
        raise ValueError(f"{name}: a task needs a positive time limit")
    hard = hard_time_limit if hard_time_limit is not None else time_limit + HARD_AFTER_S
    if hard <= time_limit:
        raise ValueError(f"{name}: the hard time limit must come after the soft one")
    options: dict[str, Any] = {
        "name": name, "base": Task, "bind": bind, "acks_late": True, "ignore_result": True,
        "soft_time_limit": time_limit, "time_limit": hard,
    }
    if queue is not None:
        options["queue"] = queue.value if isinstance(queue, Queue) else queue
    if retry_for:
        options.update(autoretry_for=retry_for, retry_backoff=True, retry_backoff_max=backoff_max,
                       retry_jitter=True)
    if max_retries is not None:
        options["max_retries"] = max_retries
    return cast("Callable[[Callable[..., Any]], Any]", shared_task(**options))
