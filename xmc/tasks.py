"""Process-level Celery tasks of the project itself.

``xmc.ping`` does nothing but finish: operators and tests send it to a queue
to see that a worker consumes that queue (and its metrics count it).
"""
from __future__ import annotations

from celery import shared_task


@shared_task(name="xmc.ping", ignore_result=True)
def ping() -> str:
    return "pong"
