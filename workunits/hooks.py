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
  whose log archive knows;
* :data:`dead_letter_requeuers`: the "send again" of a dead letter about a row
  of an app above (``DeadLetter.source``), one handler per kind of row,
  registered by that app (notifications: a delivery that ran out of tries);
  called by ``workunits.services.requeue_dead_letter``. Unlike the hooks above,
  a handler's failure reaches the caller (the admin says why).

A failing hook is logged and never fails the caller (``core.hooks``: the one shape
of an extension point).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from core.hooks import Handlers, Hooks, Provider


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


#: Listeners ``(advisories)``, registered by the notifications app.
advisory_hooks: Hooks[[Sequence[Advisory]]] = Hooks("workunits.advisory_hook_failed")


class Transition(NamedTuple):
    """A committed state change, returned for publishing after commit (a named tuple: one per change)."""

    xid: int
    wid: int
    eid: int
    old_state: str
    new_state: str


class Termination(NamedTuple):
    """How one container of an execution ended, as far as is known."""

    container: str
    exit_code: int | None
    reason: str
    last_line: str


#: Listeners ``(xid, wid, eid)``, registered by the lifecycle app.
superseded_hooks: Hooks[[int, int, int]] = Hooks("lifecycle.superseded_hook_failed")

#: Listeners ``(transitions)``, registered by the notifications app and the pages' live updates.
committed_hooks: Hooks[[Sequence[Any]]] = Hooks("workunits.committed_hook_failed")

#: Listeners ``(change_id, paused, by, reason)``, registered by the notifications app.
scheduling_hooks: Hooks[[int, bool, str, str]] = Hooks("workunits.scheduling_hook_failed")

#: ``(xid, wid) -> notify_when`` ("" while none is registered, or when it fails: the JobSet still runs).
notify_when_provider: Provider[[int, int], str] = Provider("lifecycle.notify_when_failed", str)

#: ``(xid, wid, eid) -> [Termination]`` ([] while none is registered, or when it fails).
termination_provider: Provider[[int, int, int], list[Termination]] = Provider(
    "workunits.termination_provider_failed", list)

#: ``source -> (source_id) -> None``: sends again the row a dead letter is about (its app's handler).
dead_letter_requeuers: Handlers[[int]] = Handlers("send-again handler of dead letters")


def on_execution_superseded(xid: int, wid: int, eid: int) -> None:
    """A restart archived execution ``(xid, wid, eid)`` (a failing rule never fails the restart)."""
    superseded_hooks(xid, wid, eid)


def set_termination_provider(provider: Any) -> None:
    """Register the one termination provider (None: none; :func:`termination_of` answers [])."""
    termination_provider.set(provider)


def termination_of(xid: int, wid: int, eid: int) -> list[Termination]:
    """How the containers of execution ``(xid, wid, eid)`` ended ([]: not known, or the provider failed)."""
    return list(termination_provider(xid, wid, eid))


def set_notify_when_provider(provider: Any) -> None:
    """Register the one notify-when provider (None: none, every task carries "")."""
    notify_when_provider.set(provider)


def notify_when_for(xid: int, wid: int) -> str:
    """The notify-when a Create or Restart task of this work unit carries ("" = none)."""
    return notify_when_provider(xid, wid)


def on_transitions_committed(transitions: Sequence[Any]) -> None:
    """Hand committed transitions to every registered listener (after the writer's commit)."""
    if transitions:
        committed_hooks(transitions)


def on_scheduling_changed(change_id: int, paused: bool, by: str, reason: str) -> None:
    scheduling_hooks(change_id, paused, by, reason)


def on_advisories_committed(advisories: Sequence[Advisory]) -> None:
    if advisories:
        advisory_hooks(advisories)
