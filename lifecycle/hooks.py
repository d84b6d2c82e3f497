"""Lifecycle hooks the state server calls (artifact lifecycle, STATES.md).

``on_execution_superseded`` runs after a restart commits, for the execution
that was archived. The rule registry (``lifecycle.rules``, a later issue) is
empty while ``XMC_ARTIFACT_LIFECYCLE_ENABLED`` is off, so today this only
logs. Failures are logged and never fail the restart.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

SupersededHook = Callable[[int, int, int], None]

#: Callables ``(xid, wid, eid)`` registered by lifecycle rules.
superseded_hooks: list[SupersededHook] = []


def on_execution_superseded(xid: int, wid: int, eid: int) -> None:
    for hook in list(superseded_hooks):
        try:
            hook(xid, wid, eid)
        except Exception:  # a failing rule must not fail the restart
            log.exception("lifecycle.superseded_hook_failed", extra={"xid": xid, "wid": wid, "eid": eid})
