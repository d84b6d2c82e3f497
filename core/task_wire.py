"""The actuator task envelope on the wire (``xmc.internal.v1.Task``): signing, encoding, names.

Producers (the outbox, the resumption run) and the consumer (the actuator) both
use this module, so neither reaches into the other's.


The state server's outbox and the resumption run sign; the actuator verifies
before it does anything else. The signature is HMAC-SHA256 over the
deterministic serialization of the Task with its ``signature`` field empty, so
every other field (type, ids, the packed work unit, mask, operation, times,
notify-when, expiry, key id) is covered. Keys are named: ``key_id`` picks one
from ``settings.XMC_TASK_SIGNING_KEYS`` (the current key is
``settings.XMC_TASK_SIGNING_KEY_ID``), so a key can be rotated by adding the
new one, switching the current id, and dropping the old one once no task
signed with it can still be in flight.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import time

from django.conf import settings

from core.protos import task_pb2


class InvalidTask(Exception):
    """A task that must never reach the cluster: unsigned, tampered, expired
    or signed with an unknown key. Permanent: dead-letter it."""


def _keys() -> dict[str, bytes]:
    return {k: v.encode() for k, v in settings.XMC_TASK_SIGNING_KEYS.items()}


def _digest(task: task_pb2.Task, key: bytes) -> bytes:
    unsigned = task_pb2.Task()
    unsigned.CopyFrom(task)
    unsigned.ClearField("signature")
    return hmac.new(key, unsigned.SerializeToString(deterministic=True), hashlib.sha256).digest()


def sign(task: task_pb2.Task, *, now_ns: int | None = None, ttl_s: int | None = None) -> task_pb2.Task:
    """Stamp expiry and key id on ``task`` and sign it (in place; returned)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    ttl = settings.XMC_TASK_TTL_S if ttl_s is None else ttl_s
    task.expire_time_ns = now_ns + ttl * 1_000_000_000
    task.key_id = settings.XMC_TASK_SIGNING_KEY_ID
    task.signature = _digest(task, _keys()[task.key_id])
    return task


def verify(task: task_pb2.Task, *, now_ns: int | None = None) -> None:
    """Raise :class:`InvalidTask` unless ``task`` is signed, intact and fresh."""
    if not task.signature:
        raise InvalidTask("task is not signed")
    key = _keys().get(task.key_id)
    if key is None:
        raise InvalidTask(f"task is signed with unknown key id {task.key_id!r}")
    if not hmac.compare_digest(task.signature, _digest(task, key)):
        raise InvalidTask("task signature does not match its contents")
    now_ns = time.time_ns() if now_ns is None else now_ns
    if task.expire_time_ns <= now_ns:
        raise InvalidTask("task has expired")


def decode(payload: bytes) -> task_pb2.Task:
    """Parse a serialized Task (raises :class:`InvalidTask` on garbage)."""
    task = task_pb2.Task()
    try:
        task.ParseFromString(payload)
    except Exception as exc:  # google.protobuf.message.DecodeError and kin
        raise InvalidTask(f"task payload does not parse: {exc}") from exc
    return task


#: The one update-mask path an Update task knows today.
NOTIFY_WHEN_PATH = "metadata.annotations.notify-when"


#: The actuator's Celery task for each Task type (one positional argument:
#: the signed, serialized Task as base64 text).
ACTUATOR_TASK_NAMES: dict[int, str] = {
    task_pb2.Task.CREATE: "xmc.actuator.create",
    task_pb2.Task.DELETE: "xmc.actuator.delete",
    task_pb2.Task.RESTART: "xmc.actuator.restart",
    task_pb2.Task.UPDATE: "xmc.actuator.update",
}


def encode_task(task: task_pb2.Task) -> str:
    return base64.b64encode(task.SerializeToString(deterministic=True)).decode("ascii")


def decode_task(text: str) -> task_pb2.Task:
    """The inverse of :func:`encode_task` (raises ``InvalidTask`` on garbage)."""
    try:
        payload = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise InvalidTask(f"task payload is not base64: {exc}") from exc
    return decode(payload)
