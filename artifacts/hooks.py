"""Extension points of the artifacts app: who wants to hear that an artifact was attached.

``artifacts.services`` calls :func:`on_artifact_attached` inside the
transaction that attaches an artifact (or gives it a payload of a new kind) to
a work unit. The lifecycle registers into :data:`attached_hooks` in its
``AppConfig.ready()`` (``lifecycle.stamping.on_artifact_attached`` patches the
running JobSet's notify-when after commit), so ``artifacts`` never imports it.
"""
from __future__ import annotations

from collections.abc import Callable

AttachedHook = Callable[[int, int, str], None]

#: Callables ``(xid, wid, payload_kind)``, called inside the attaching transaction.
attached_hooks: list[AttachedHook] = []


def on_artifact_attached(xid: int, wid: int, payload_kind: str) -> None:
    for hook in list(attached_hooks):
        hook(xid, wid, payload_kind)
