"""Extension points of the work units app: what it calls out to, without knowing who listens.

Apps above (the artifact lifecycle) register into these in their
``AppConfig.ready()`` (``lifecycle.apps``), so ``workunits`` never imports them:

* :data:`superseded_hooks`: called by ``workunits.services`` after a restart
  commits, with ``(xid, wid, eid)`` of the execution that was archived
  (:func:`on_execution_superseded`);
* the notify-when provider (:func:`set_notify_when_provider`): asked by the
  outbox and the resumption run for the ``notify_when`` of a Create or Restart
  task (:func:`notify_when_for`; "" while none is registered);
* :class:`Transition`: what ``workunits.services.update_work_unit_executions``
  returns for each committed state change (the reconciler hands them on to
  the lifecycle after commit);
* :data:`committed_hooks`: called with the committed transitions after a
  flush commits (the reconciler calls :func:`on_transitions_committed`, and
  so do ``workunits.services.stop_work_units`` / ``restart_work_units`` for
  the STOPPING / RESTARTING they write), registered by the notifications
  app and the pages' live updates (``ui.live.publish``);
* :data:`scheduling_hooks`: called after a pause or resume of scheduling
  commits (:func:`on_scheduling_changed`, from ``workunits.scheduling``);
* :data:`advisory_hooks`: called with the :class:`Advisory` items (an
  execution's GPUs idle, its memory near the limit, or either cleared) after
  ``workunits.services.write_advisories`` committed them
  (:func:`on_advisories_committed`; the system metrics' collector writes
  them), registered by the notifications app (WORK_UNIT_IDLE);
* the termination provider (:func:`set_termination_provider`): asked by the
  notifications for how a failed execution's containers ended (exit code,
  reason, last log line; :func:`termination_of`), registered by ``k8s_bridge``,
  whose log archive knows.

A failing hook is logged and never fails the caller.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

SupersededHook = Callable[[int, int, int], None]
NotifyWhenProvider = Callable[[int, int], str]

#: Callables ``(xid, wid, eid)``, registered by the lifecycle app.
superseded_hooks: list[SupersededHook] = []

_notify_when_provider: list[NotifyWhenProvider] = []

#: Callables ``(transitions)``, registered by the notifications app.
committed_hooks: list[Callable[[Sequence[Any]], None]] = []

#: Callables ``(change_id, paused, by, reason)``, registered by the notifications app.
scheduling_hooks: list[Callable[[int, bool, str, str], None]] = []


class Advisory(NamedTuple):
    """A WARNING system message the system metrics raise on a running execution, or its clearing.

    ``kind`` is ``"idle"`` (its GPUs below the idle threshold), ``"memory"`` (near
    its memory limit) or ``""`` (cleared: ``text`` is empty); ``since`` (an ISO
    time) names the episode; ``data`` carries the figures (``gpus``, ``idleSeconds``...).
    """

    xid: int
    wid: int
    eid: int
    kind: str
    text: str
    since: str
    data: dict[str, Any]


#: Callables ``(advisories)``, registered by the notifications app.
advisory_hooks: list[Callable[[Sequence[Advisory]], None]] = []


class Transition(NamedTuple):
    """A committed state change, returned for publishing after commit (a named tuple: one per change)."""

    xid: int
    wid: int
    eid: int
    old_state: str
    new_state: str


def on_execution_superseded(xid: int, wid: int, eid: int) -> None:
    for hook in list(superseded_hooks):
        try:
            hook(xid, wid, eid)
        except Exception:  # a failing rule must not fail the restart
            log.exception("lifecycle.superseded_hook_failed", extra={"xid": xid, "wid": wid, "eid": eid})


class Termination(NamedTuple):
    """How one container of an execution ended, as far as is known."""

    container: str
    exit_code: int | None
    reason: str
    last_line: str


TerminationProvider = Callable[[int, int, int], list[Termination]]
_termination_provider: list[TerminationProvider] = []


def set_termination_provider(provider: TerminationProvider | None) -> None:
    """Register the one termination provider (None: none; :func:`termination_of` answers [])."""
    _termination_provider[:] = [provider] if provider is not None else []


def termination_of(xid: int, wid: int, eid: int) -> list[Termination]:
    """How the containers of execution ``(xid, wid, eid)`` ended ([]: not known, or the provider failed)."""
    if not _termination_provider:
        return []
    try:
        return list(_termination_provider[0](xid, wid, eid))
    except Exception:  # a message without the last line is better than none
        log.exception("workunits.termination_provider_failed", extra={"xid": xid, "wid": wid, "eid": eid})
        return []


def set_notify_when_provider(provider: NotifyWhenProvider | None) -> None:
    """Register the one notify-when provider (None: none, every task carries "")."""
    _notify_when_provider[:] = [provider] if provider is not None else []


def notify_when_for(xid: int, wid: int) -> str:
    """The notify-when a Create or Restart task of this work unit carries ("" = none).

    A failure of the provider is logged and stamps nothing (the JobSet still runs).
    """
    if not _notify_when_provider:
        return ""
    try:
        return _notify_when_provider[0](xid, wid)
    except Exception:
        log.exception("lifecycle.notify_when_failed", extra={"xid": xid, "wid": wid})
        return ""


def on_transitions_committed(transitions: Sequence[Any]) -> None:
    """Hand committed transitions to every registered listener (after the writer's commit)."""
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


def on_advisories_committed(advisories: Sequence[Advisory]) -> None:
    if not advisories:
        return
    for hook in list(advisory_hooks):
        try:
            hook(advisories)
        except Exception:
            log.exception("workunits.advisory_hook_failed")
