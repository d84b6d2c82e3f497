"""The system metrics' WARNINGs on running executions: GPUs idle, memory near its limit.

Called by the system metrics' collector (``metrics.system``) with what each
running execution should say; docs/architecture/system_metrics.md. One durable
transaction: the work units are locked in (xid, wid) order as every writer
does, each execution's message is read under the lock, and only then set or
cleared, so a message another writer put there (a retry WARNING, an ERROR) is
never overwritten nor cleared: an advisory is written only where the execution
has no system message or has one of these (``is_advisory``), and cleared only
where it has one of these. After commit the change goes to
``workunits.hooks.on_transitions_committed`` as a same-state transition (the
open pages read the unit again) and to ``workunits.hooks.on_advisories_committed``
(the WORK_UNIT_IDLE notification).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from workunits import state
from workunits.choices import WorkUnitState, Writer
from workunits.hooks import Advisory, Transition, on_advisories_committed, on_transitions_committed
from workunits.services.executions import _apply_updates, _lock_work_unit_rows, _read_executions
from workunits.state import ExecutionUpdate


def _warning(text: str) -> dict[str, Any]:
    return {"severity": "WARNING", "source": "XMANAGER_BACKEND", "userFacingText": text}


def write_advisories(advice: Sequence[Advisory], *, is_advisory: Callable[[Mapping[str, Any] | None], bool],
                     now: datetime | None = None) -> list[Advisory]:
    """Set (``text``) or clear (empty ``text``) each execution's advisory; the ones that changed a message.

    Only the work unit's current, RUNNING execution is touched; one that says
    the same already is left as it is (a second collector of the same cycle
    writes nothing).
    """
    if not advice:
        return []
    now = now or timezone.now()
    written: list[Advisory] = []
    with transaction.atomic(durable=True):
        locked = _lock_work_unit_rows((a.xid, a.wid) for a in advice)
        current = _read_executions([wu.id for wu in locked.values()]) if locked else {}
        updates = []
        for a in advice:
            wu = locked.get((a.xid, a.wid))
            if wu is None or wu.current_eid != a.eid or wu.id not in current:
                continue
            _, eid, record = current[wu.id]
            if eid != a.eid or record.state != WorkUnitState.RUNNING:
                continue
            message = record.system_message
            ours = bool(message) and is_advisory(message)
            if a.text:
                if message and not ours:
                    continue  # another writer's message stays
                if ours and message and message.get("userFacingText") == a.text:
                    continue
            elif not ours:
                continue
            updates.append(ExecutionUpdate(xid=a.xid, wid=a.wid, eid=a.eid, mask=(state.SYSTEM_MESSAGE,),
                                           system_message=_warning(a.text) if a.text else None,
                                           writer=Writer.SYSTEM_METRICS, extra={"advisory": a.kind or "cleared"}))
            written.append(a)
        if updates:
            _apply_updates(updates, now)
            told = [Transition(a.xid, a.wid, a.eid, WorkUnitState.RUNNING, WorkUnitState.RUNNING) for a in written]
            transaction.on_commit(partial(on_transitions_committed, told))
            transaction.on_commit(partial(on_advisories_committed, list(written)))
    return written
