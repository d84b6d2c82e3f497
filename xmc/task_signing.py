"""Signing and verifying actuator task envelopes (``xmc.internal.v1.Task``).

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

import hashlib
import hmac
import time

from django.conf import settings

from xmc.protos import task_pb2


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
