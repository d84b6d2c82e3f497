"""Extension points of the artifacts app: who wants to hear that an artifact was attached.

``artifacts.services`` calls :func:`on_artifact_attached` inside the
transaction that attaches an artifact (or gives it a payload of a new kind) to
a work unit. The lifecycle registers into :data:`attached_hooks` in its
``AppConfig.ready()`` (``lifecycle.stamping.on_artifact_attached`` patches the
running JobSet's notify-when after commit), so ``artifacts`` never imports it.
"""
from __future__ import annotations

from core.hooks import Hooks

#: Listeners ``(xid, wid, payload_kind)``, called inside the attaching transaction: a failure rolls it back.
attached_hooks: Hooks[[int, int, str]] = Hooks("artifacts.attached_hook_failed", contained=False)


def on_artifact_attached(xid: int, wid: int, payload_kind: str) -> None:
    attached_hooks(xid, wid, payload_kind)
