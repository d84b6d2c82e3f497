"""The one sweep: whatever's lease ran out (or never reached the broker) is sent again.

Each table's owner registers a re-sender (:func:`register`) in its
``AppConfig.ready``: a function that re-sends that table's due rows and says
how many were due. The beat runs them all from one task
(``delivery.tasks.sweep``, one beat entry).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

_RESENDERS: dict[str, Callable[[], int]] = {}


def register(name: str, resend: Callable[[], int]) -> None:
    """``resend()`` re-sends the due rows of one table; ``name`` says which in logs and results."""
    _RESENDERS[name] = resend


def sweep() -> dict[str, int]:
    """Run every registered re-sender; one failing does not stop the others. How many rows each re-sent."""
    done: dict[str, int] = {}
    for name, resend in sorted(_RESENDERS.items()):
        try:
            done[name] = resend()
        except Exception:
            log.exception("delivery.sweep_failed", extra={"table": name})
            done[name] = -1
    return done
