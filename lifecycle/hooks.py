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

While ``XMC_ARTIFACT_LIFECYCLE_ENABLED`` is off the rule registry is empty,
so these do nothing. Failures are logged and never fail the caller.
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
    """The encoded states the rules want for this work unit's artifacts ("" = none)."""
    return ""


def on_jobset_observed(context: JobSetContext, state: str) -> None:
    """Called by the reconciler for each observed JobSet with its mapped state."""


def on_transitions_committed(
    transitions: Sequence[CommittedTransition], contexts: Mapping[tuple[int, int, int], JobSetContext]
) -> None:
    """Called by the reconciler after a flush commits; ``contexts`` is keyed (xid, wid, eid)."""
