"""Slots for WaitOperation: a wait may hold a gRPC worker thread, so few may at once.

`xmc.api.handlers.wait_operation` takes a slot before it polls. Slots are
capped per identity (``XMC_WAIT_MAX_PER_IDENTITY``) and per process
(``XMC_WAIT_MAX_CONCURRENT``, keep it well under ``XMC_GRPC_MAX_WORKERS``):
a caller that finds no free slot is not queued -- its WaitOperation returns
at once with the operation as it is (AIP-151 allows returning before the
operation is done; the client polls again). So however many waits are open,
the other worker threads stay free for every other RPC.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from django.conf import settings

_lock = threading.Lock()
_total = 0
_per_identity: dict[str, int] = {}


@contextlib.contextmanager
def slot(identity_key: str) -> Iterator[bool]:
    """Yield True holding a wait slot for ``identity_key``, or False when none is free."""
    global _total
    with _lock:
        mine = _per_identity.get(identity_key, 0)
        granted = _total < settings.XMC_WAIT_MAX_CONCURRENT and mine < settings.XMC_WAIT_MAX_PER_IDENTITY
        if granted:
            _total += 1
            _per_identity[identity_key] = mine + 1
    try:
        yield granted
    finally:
        if granted:
            with _lock:
                _total -= 1
                left = _per_identity[identity_key] - 1
                if left:
                    _per_identity[identity_key] = left
                else:
                    del _per_identity[identity_key]


def open_waits() -> int:
    """How many waits hold a slot in this process (tests, metrics)."""
    with _lock:
        return _total
