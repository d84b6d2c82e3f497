"""The only place a message is handed to the broker (``send_task``).

Callers publish what a committed row asks for; a publish that fails raises
(after kombu's few quick tries, :data:`PUBLISH_RETRY_POLICY`), and the row
stays due for the sweep (``delivery.sweep``). tests/architecture fails if
any other production module calls ``send_task`` or ``apply_async``.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from celery import current_app

#: kombu's publish retry: a few quick tries, then the caller records the failure
#: (a request must not hang on a dead broker; the sweep tries again later).
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.4, "interval_max": 1.0}


@contextmanager
def producer() -> Iterator[Any]:
    """One producer (and broker connection) for a batch of publishes."""
    with current_app.producer_or_acquire() as p:
        yield p


def publish(task_name: str, args: Sequence[Any], *, queue: str, kwargs: dict[str, Any] | None = None,
            producer: Any = None, countdown: float | None = None, argsrepr: str | None = None) -> None:
    """Send Celery task ``task_name`` to ``queue``; raises when the broker does not take it."""
    options: dict[str, Any] = {}
    if argsrepr is not None:
        options["argsrepr"] = argsrepr  # what logs and monitors show instead of the arguments
    current_app.send_task(
        task_name, args=list(args), kwargs=kwargs or {}, queue=queue, countdown=countdown or None,
        retry=True, retry_policy=PUBLISH_RETRY_POLICY, producer=producer,
        # No result is ever read, and the workers declare the queue they consume.
        ignore_result=True, declare=[], **options)
