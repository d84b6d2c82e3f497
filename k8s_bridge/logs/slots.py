"""Followed-log slots of one web process: a global cap, and a fair share per user.

A followed log (REST ``follow=true``, `k8s_bridge.logs.views`; the page's
Follow, ``ui.logfollow``) holds a request thread and a cluster stream for up
to an hour, so a process keeps at most ``XMC_LOGS_MAX_FOLLOWS`` open. With one
pool for everybody, one user following his own jobs gave everyone else 429.
Now a user may hold at most a fair share of the cap,
``max(1, cap // (others + 2))`` where ``others`` is the number of other users
holding a slot: alone, half the cap (the other half stays for whoever comes
next); a newcomer always gets one while any is free. Only the global cap
turns away a user holding none.

`acquire` and `release` take the user's email (the identity); the caller gives
back exactly what it took, once (the views do it when the stream ends or the
client goes away).
"""
from __future__ import annotations

import threading
from collections import Counter

from django.conf import settings

_LOCK = threading.Lock()
_HELD: Counter[str] = Counter()


def fair_share(cap: int, others: int) -> int:
    """Most slots one user may hold while ``others`` other users hold some."""
    return max(1, cap // (others + 2))


def acquire(user: str) -> bool:
    """Take a slot for ``user``; False (the caller answers 429) when the process is full or the user
    holds their fair share."""
    cap = max(1, int(settings.XMC_LOGS_MAX_FOLLOWS))
    with _LOCK:
        if sum(_HELD.values()) >= cap:
            return False
        others = sum(1 for who, n in _HELD.items() if n and who != user)
        if _HELD[user] >= fair_share(cap, others):
            return False
        _HELD[user] += 1
        return True


def release(user: str) -> None:
    with _LOCK:
        if _HELD[user] > 0:
            _HELD[user] -= 1
        if not _HELD[user]:
            del _HELD[user]


def held(user: str | None = None) -> int:
    """Slots held by ``user`` (by everyone when None)."""
    with _LOCK:
        return sum(_HELD.values()) if user is None else _HELD[user]


def reset() -> None:
    """Forget every slot (tests only: a process's streams end with it)."""
    with _LOCK:
        _HELD.clear()
