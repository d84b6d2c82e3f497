"""The cast of the pause/resume stories.

Olivia is the operator; Alice owns the experiments. Work units are made with
the real services (``tests.factories``); actuator tasks are built as the
outbox builds them and signed. What resumption sends goes through the real
Celery producer into this test run's Redis database, and is read back from
the ``actuator`` list (``actuator_messages``).
"""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from core import convert, task_wire
from core.protos import task_pb2
from core.task_wire import decode_task
from tests.fixtures.people import OLIVIA as OLIVIA  # the operator of the stories here
from workunits.models import Operation, WorkUnit


TYPES = {"CREATE": task_pb2.Task.CREATE, "RESTART": task_pb2.Task.RESTART,
         "UPDATE": task_pb2.Task.UPDATE, "DELETE": task_pb2.Task.DELETE}


def task_for(wu: WorkUnit, kind: str, *, eid: int | None = None, notify_when: str = "") -> task_pb2.Task:
    """The signed Task the outbox sends for the work unit's latest operation of ``kind``."""
    wu.refresh_from_db()
    eid = wu.current_eid if eid is None else eid
    op = Operation.objects.filter(work_unit=wu).order_by("-id").first()
    task = task_pb2.Task(
        type=TYPES[kind], xid=wu.experiment_id, wid=wu.wid, eid=eid,
        target_eid=eid - 1 if kind == "RESTART" else (eid if kind == "DELETE" else 0),
        operation_name=op.name if op is not None and kind != "UPDATE" else "",
        operation_time_ns=convert.ns_from_datetime(timezone.now()), notify_when=notify_when,
    )
    if kind == "UPDATE":
        task.update_mask.paths.append("metadata.annotations.notify-when")
    return task_wire.sign(task)


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    """This run's Redis database, emptied before and after the story."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def queue_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """Celery messages waiting on ``queue``, oldest first: {"task": name, "args": [...]}."""
    out = []
    for raw in reversed(client.lrange(queue, 0, -1)):  # kombu LPUSHes, workers BRPOP
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        out.append({"task": message["headers"]["task"], "args": args})
    return out


def actuator_messages(client: redis.Redis) -> list[tuple[str, task_pb2.Task]]:
    return [(m["task"], decode_task(m["args"][0])) for m in queue_messages(client, "actuator")]
