"""Lifecycle hooks other processes call (artifact lifecycle, docs/architecture/state_machine.md).

These are the seams between the control loop and the artifact lifecycle:

* the state server calls :func:`on_execution_superseded` after a restart
  commits, for the execution that was archived;
* the outbox (actuator issue) stamps :func:`notify_when_for` on Create and
  Restart tasks (the JobSet builder turns it into the
  ``xmc.google.com/notify-when`` annotation);
* the reconciler calls :func:`on_jobset_observed` for every JobSet it maps
  and :func:`on_transitions_committed` after each committed flush, with the
  JobSets the transitions belong to; the lifecycle issue turns those into
  ``ArtifactLifecycleEvent`` messages.

While ``XMC_ARTIFACT_LIFECYCLE_ENABLED`` is off the rule registry is empty:
no notify-when, no events; the reconciler-side legacy sync keeps the
MachineLearningRun in step instead. Failures are logged and never fail the
caller. docs/architecture/lifecycle.md describes the whole mechanism.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

log = logging.getLogger(__name__)

SupersededHook = Callable[[int, int, int], None]

#: Callables ``(xid, wid, eid)`` registered by lifecycle rules.
superseded_hooks: list[SupersededHook] = []


class CommittedTransition(Protocol):
    """What ``workunits.services.Transition`` carries (xid, wid, eid, old, new)."""

    xid: int
    wid: int
    eid: int
    old_state: str
    new_state: str


@dataclass(frozen=True)
class JobSetContext:
    """The JobSet an execution runs as, as the reconciler last saw it."""

    xid: int
    wid: int
    eid: int
    namespace: str
    name: str
    uid: str
    creation_time: datetime | None
    #: The ``xmc.google.com/notify-when`` annotation ("" when absent).
    notify_when: str
    cluster: str = ""


def on_execution_superseded(xid: int, wid: int, eid: int) -> None:
    for hook in list(superseded_hooks):
        try:
            hook(xid, wid, eid)
        except Exception:  # a failing rule must not fail the restart
            log.exception("lifecycle.superseded_hook_failed", extra={"xid": xid, "wid": wid, "eid": eid})


def notify_when_for(xid: int, wid: int) -> str:
    """The encoded states the rules want for this work unit's artifacts ("" = none, or flag off).

    Owned by :func:`lifecycle.notify_when.notify_when_for`; a failure is
    logged and stamps nothing (the JobSet still runs).
    """
    from lifecycle import notify_when

    try:
        return notify_when.notify_when_for(xid, wid)
    except Exception:
        log.exception("lifecycle.notify_when_failed", extra={"xid": xid, "wid": wid})
        return ""


def on_jobset_observed(context: JobSetContext, state: str) -> None:
    """Called by the reconciler for each observed JobSet with its mapped state.

    Flag on: force-notify once when the JobSet's notify-when is newly added
    (:func:`lifecycle.events.on_jobset_observed`). Flag off: the legacy
    inline MachineLearningRun sync (:func:`lifecycle.services.legacy_sync`).
    """
    from django.conf import settings

    try:
        if settings.XMC_ARTIFACT_LIFECYCLE_ENABLED:
            from lifecycle import events

            events.on_jobset_observed(context, state)
        else:
            from lifecycle import services

            services.legacy_sync(context, state)
    except Exception:
        log.exception("lifecycle.on_jobset_observed_failed", extra={"uid": context.uid, "eid": context.eid})


def on_transitions_committed(
    transitions: Sequence[CommittedTransition], contexts: Mapping[tuple[int, int, int], JobSetContext]
) -> None:
    """Called by the reconciler after a flush commits; ``contexts`` is keyed (xid, wid, eid).

    Flag on: one lifecycle event per committed transition whose new state
    the JobSet's notify-when names (:func:`lifecycle.events.on_transitions_committed`).
    """
    from django.conf import settings

    if not settings.XMC_ARTIFACT_LIFECYCLE_ENABLED or not transitions:
        return
    try:
        from lifecycle import events

        events.on_transitions_committed(transitions, contexts)
    except Exception:
        log.exception("lifecycle.on_transitions_committed_failed")


def _close_superseded(xid: int, wid: int, eid: int) -> None:
    from lifecycle import services

    services.on_execution_superseded(xid, wid, eid)
