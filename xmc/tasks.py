"""Process-level Celery tasks of the project itself.

``xmc.ping`` does nothing but finish: operators and tests send it to a queue
to see that a worker consumes that queue (and its metrics count it).
"""
from __future__ import annotations

from delivery import declare


@declare.task(name="xmc.ping", queue=None, time_limit=60)  # sent to whichever queue is probed
def ping() -> str:
    return "pong"
