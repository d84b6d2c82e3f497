"""The reconciler's entry into the artifact lifecycle (docs/architecture/lifecycle.md).

The reconciler calls :func:`on_jobset_observed` for every JobSet it maps and
:func:`on_transitions_committed` after each committed flush, with the JobSets
(:class:`JobSetContext`) the transitions belong to; with
``XMC_ARTIFACT_LIFECYCLE_ENABLED`` on those become ``ArtifactLifecycleEvent``
messages (``lifecycle.events``). With the flag off the rule registry is
empty: no notify-when, no events; the legacy sync keeps the
MachineLearningRun in step instead (``lifecycle.services.legacy_sync``).
Failures are logged and never fail the caller.

The hooks the lower apps call (a restart's superseded execution, the
notify-when of a task, an attached artifact) are theirs: ``workunits.hooks``
and ``artifacts.hooks``; ``lifecycle.apps`` registers into them.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from django.conf import settings

from lifecycle import events, services
from lifecycle.events import JobSetContext as JobSetContext
from workunits.hooks import Transition

log = logging.getLogger(__name__)


def on_jobset_observed(context: JobSetContext, state: str) -> None:
    """Called by the reconciler for each observed JobSet with its mapped state.

    Flag on: force-notify once when the JobSet's notify-when is newly added
    (:func:`lifecycle.events.on_jobset_observed`). Flag off: the legacy
    inline MachineLearningRun sync (:func:`lifecycle.services.legacy_sync`).
    """
    try:
        if settings.XMC_ARTIFACT_LIFECYCLE_ENABLED:
            events.on_jobset_observed(context, state)
        else:
            services.legacy_sync(context, state)
    except Exception:
        log.exception("lifecycle.on_jobset_observed_failed", extra={"uid": context.uid, "eid": context.eid})


def on_transitions_committed(
    transitions: Sequence[Transition], contexts: Mapping[tuple[int, int, int], JobSetContext]
) -> None:
    """Called by the reconciler after a flush commits; ``contexts`` is keyed (xid, wid, eid).

    Flag on: one lifecycle event per committed transition whose new state
    the JobSet's notify-when names (:func:`lifecycle.events.on_transitions_committed`).
    """
    if not settings.XMC_ARTIFACT_LIFECYCLE_ENABLED or not transitions:
        return
    try:
        events.on_transitions_committed(transitions, contexts)
    except Exception:
        log.exception("lifecycle.on_transitions_committed_failed")
