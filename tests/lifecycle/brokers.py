"""Read what was published to a Celery queue on the test Redis, the way a worker would receive it."""
from __future__ import annotations

import base64
import json
from typing import Any

import redis
from django.conf import settings


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def purge(queue: str) -> None:
    _client().delete(queue)


def drain(queue: str) -> list[tuple[str, list[Any]]]:
    """Remove and return every message of ``queue`` as (task name, args)."""
    client = _client()
    out: list[tuple[str, list[Any]]] = []
    while (raw := client.rpop(queue)) is not None:
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        out.append((message["headers"]["task"], list(body[0])))
    return out
