"""Extension points for what the work units app committed, without knowing who listens.

Apps above (notifications) register into these lists in their
``AppConfig.ready()``; ``workunits`` and the reconciler never import them:

* :data:`committed_hooks`: called with the committed
  ``workunits.services.Transition`` values after a flush commits (the
  reconciler calls :func:`on_transitions_committed` after commit, beside the
  lifecycle's hook);
* :data:`scheduling_hooks`: called after a pause or resume of scheduling
  commits (:func:`on_scheduling_changed`, from ``workunits.scheduling``).

A failing hook is logged and never fails the caller.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

#: Callables ``(transitions)``; each transition has xid, wid, eid, old_state, new_state.
committed_hooks: list[Callable[[Sequence[Any]], None]] = []

#: Callables ``(change_id, paused, by, reason)``.
scheduling_hooks: list[Callable[[int, bool, str, str], None]] = []


def on_transitions_committed(transitions: Sequence[Any]) -> None:
    if not transitions:
        return
    for hook in list(committed_hooks):
        try:
            hook(transitions)
        except Exception:  # a listener must never fail the writer
            log.exception("workunits.committed_hook_failed")


def on_scheduling_changed(change_id: int, paused: bool, by: str, reason: str) -> None:
    for hook in list(scheduling_hooks):
        try:
            hook(change_id, paused, by, reason)
        except Exception:
            log.exception("workunits.scheduling_hook_failed")
