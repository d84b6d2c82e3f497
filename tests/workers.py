"""A pytest plugin, loaded first (``-p tests.workers`` in pytest.ini): what makes a
pytest-xdist worker's services its own.

pytest-django gives each worker its own test database (``test_<name>_gw<N>``).
Redis has no such thing, so a worker's ``REDIS_URL`` (and ``CELERY_BROKER_URL``
when it is the same server) points at its own database number: the base URL's
number plus 1 + N. Queues, rate-limit buckets, the sign-in throttle and the
live channels (which carry the database number, ``ui.live.channel()``) are then
apart, and a fixture's ``flushdb`` touches only its own worker's state.

It must run before the settings are read: pytest-django reads them while it
loads the first conftest, so this is a ``-p`` plugin, imported while pytest
parses its options, and it only rewrites the environment.
"""
from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

#: Redis servers have 16 databases by default; db 0 stays the serial run's.
REDIS_DATABASES = 16


def worker_index() -> int | None:
    """N of ``gwN``, or None outside an xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else None


def redis_url_for_worker(url: str, index: int) -> str:
    """``url`` with its database number moved to the worker's own (base + 1 + index)."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    base = int(path) if path.isdigit() else 0
    db = base + 1 + index
    if db >= REDIS_DATABASES:
        raise RuntimeError(f"xdist worker gw{index} would need Redis database {db} of {REDIS_DATABASES}: "
                           f"use fewer workers (-n) or a lower database in REDIS_URL ({url})")
    return urlunsplit(parts._replace(path=f"/{db}"))


def _assign() -> None:
    index = worker_index()
    if index is None:
        return
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    own = redis_url_for_worker(url, index)
    # CELERY_BROKER_URL follows REDIS_URL in the settings when it is unset: it is moved only when it
    # was set to the same server. Setting it here otherwise would leak into every process a test
    # starts, and a whole ./dev run of a test would take the suite's broker for its own.
    if os.environ.get("CELERY_BROKER_URL") == url:
        os.environ["CELERY_BROKER_URL"] = own
    os.environ["REDIS_URL"] = own


_assign()
