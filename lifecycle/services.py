"""The lifecycle consumer's logic, the superseded-execution finalizer and the legacy sync.

* :func:`handle_event`: run every rule in force that wants the event's state
  over the work unit's artifacts of its kinds (the Celery task
  ``xmc.lifecycle.handle_event`` is a thin adapter around it);
* :func:`record_run`: the writes a rule makes after its external call: the
  artifacts' ``xprof_url`` (fenced on ``eid == current_eid``, through
  ``artifacts.services``) and the execution's ``metadata.mlrun_url``
  (through ``workunits.services``' masked update, fenced the same way);
* :func:`on_execution_superseded`: registered as a ``workunits.hooks``
  superseded hook (``lifecycle.apps``); enqueues ``xmc.lifecycle.close_superseded`` so a restart
  never waits for the external service and a failed close is retried;
* :func:`legacy_sync`: with the flag off, the reconciler keeps the
  MachineLearningRun in step inline, as before the lifecycle existed (no
  notify-when, no events, no persisted ``xprof_url``; reads construct it).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from artifacts import services as artifact_services
from artifacts.models import Artifact
from core.queues import Queue
from experiments.models import Experiment
from lifecycle import rules
from lifecycle.events import JobSetContext, LifecycleEvent, Runtime
from lifecycle.mlrun_client import MLRunClient
from workunits import delivery
from workunits import services as workunit_services
from workunits import state as workunit_state
from workunits.choices import Writer
from workunits.models import WorkUnit, WorkUnitExecution

log = logging.getLogger(__name__)

CLOSE_SUPERSEDED_TASK = "xmc.lifecycle.close_superseded"


def current_eid(xid: int, wid: int) -> int | None:
    return WorkUnit.objects.filter(experiment_id=xid, wid=wid).values_list("current_eid", flat=True).first()


def committed_state(xid: int, wid: int, eid: int) -> str:
    """The committed state of execution ``eid`` ("" when there is no such execution)."""
    return str(
        WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid, eid=eid)
        .values_list("state", flat=True).first() or ""
    )


def experiment_title(xid: int) -> str:
    return str(Experiment.objects.filter(id=xid).values_list("title", flat=True).first() or "")


def artifacts_for(xid: int, wid: int, kinds: frozenset[str]) -> list[Artifact]:
    """The work unit's artifacts of ``kinds``, oldest first (read in chunks)."""
    query = Artifact.objects.filter(experiment_id=xid, work_unit__wid=wid, payload_kind__in=sorted(kinds)).order_by("id")
    return list(query.iterator(chunk_size=500))


def record_run(event: LifecycleEvent, url: str, artifacts: Sequence[Any], *, persist: bool = True) -> bool:
    """Record the run's URL; False when ``event.eid`` is no longer the current execution."""
    if persist:
        current = artifact_services.set_xprof_url(event.xid, event.wid, event.eid, url, [a.id for a in artifacts])
    else:
        current = current_eid(event.xid, event.wid) == event.eid
    if current:
        workunit_services.update_work_unit_executions([
            workunit_state.ExecutionUpdate(
                xid=event.xid, wid=event.wid, eid=event.eid, mask=(workunit_state.MLRUN_URL,), mlrun_url=url,
                writer=Writer.LIFECYCLE,
            )
        ])
    return current


class _Store:
    """The reads and writes of this module a rule makes (``rules.RunStore``), passed to ``rule.handle``."""

    def record_run(self, event: LifecycleEvent, url: str, artifacts: Sequence[Any], *, persist: bool = True) -> bool:
        return record_run(event, url, artifacts, persist=persist)

    def current_eid(self, xid: int, wid: int) -> int | None:
        return current_eid(xid, wid)

    def committed_state(self, xid: int, wid: int, eid: int) -> str:
        return committed_state(xid, wid, eid)

    def experiment_title(self, xid: int) -> str:
        return experiment_title(xid)


STORE = _Store()


def handle_event(event: LifecycleEvent) -> None:
    """Run the matching rules; errors of the external service propagate (the event is redelivered)."""
    for rule in rules.registry():
        if event.new_state not in rule.wanted_states:
            continue
        artifacts = artifacts_for(event.xid, event.wid, rule.payload_kinds)
        if artifacts:
            rule.handle(event, artifacts, STORE)


def close_superseded(xid: int, wid: int, eid: int) -> None:
    """Close what execution ``eid`` held (called by the Celery task after a restart)."""
    mlrun_url = str(
        (WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid, eid=eid)
         .values_list("metadata", flat=True).first() or {}).get("mlrunUrl", "")
    )
    for rule in rules.registry():
        if artifacts_for(xid, wid, rule.payload_kinds):
            rule.close_superseded(xid, wid, eid, mlrun_url)


def on_execution_superseded(xid: int, wid: int, eid: int) -> None:
    """Superseded hook (after the restart committed): enqueue the close; never fails the restart."""
    if not rules.registry():
        return
    try:  # an outbox row in the restart's transaction when there is one, sent after commit
        delivery.enqueue(Queue.LIFECYCLE.value, CLOSE_SUPERSEDED_TASK, [xid, wid, eid])
    except Exception:
        log.exception("lifecycle.close_superseded.enqueue_failed", extra={"xid": xid, "wid": wid, "eid": eid})


# --- Legacy path (flag off) --------------------------------------------------------------


class _LegacyState:
    """What the legacy sync last did per (JobSet UID, eid), so it calls out once per phase change."""

    NO_ARTIFACT_RECHECK_S = 30.0

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.synced: dict[tuple[str, int], str] = {}
        self.no_artifacts_until: dict[tuple[str, int], float] = {}
        self.rule: rules.ManagedXprofRule | None = None
        self.rule_key: tuple[str, ...] = ()

    def clear(self) -> None:
        with self.lock:
            self.synced.clear()
            self.no_artifacts_until.clear()
            self.rule = None


legacy = _LegacyState()


def _legacy_rule() -> rules.ManagedXprofRule | None:
    project, location = settings.XMC_MLRUN_PROJECT, settings.XMC_MLRUN_LOCATION
    if not project or not location:
        return None  # the legacy sync was always optional: no MachineLearningRun service configured
    key = (project, location, settings.XMC_MLRUN_ENDPOINT, settings.XMC_MLRUN_TOKEN)
    with legacy.lock:
        if legacy.rule is None or legacy.rule_key != key:
            legacy.rule = rules.ManagedXprofRule(MLRunClient.from_settings())
            legacy.rule_key = key
        return legacy.rule


def _phase_class(state: str) -> str:
    if state in rules.ACTIVE_STATES:
        return "ACTIVE"
    return rules.TERMINAL_PHASE.get(state, "")


def legacy_sync(context: JobSetContext, state: str) -> None:
    """Flag off: keep the run of ``context``'s execution in step with ``state``, inline.

    Called for every observed JobSet; calls the service only when the phase
    the state asks for changed since the last successful sync of that
    (UID, eid). Errors are logged and retried at the next observation.
    """
    wanted = _phase_class(state)
    if not wanted:
        return
    rule = _legacy_rule()
    if rule is None:
        return
    key = (context.uid, context.eid)
    now = time.monotonic()
    with legacy.lock:
        if legacy.synced.get(key) == wanted or legacy.no_artifacts_until.get(key, 0.0) > now:
            return
    artifacts = artifacts_for(context.xid, context.wid, rule.payload_kinds)
    if not artifacts:
        with legacy.lock:
            legacy.no_artifacts_until[key] = now + legacy.NO_ARTIFACT_RECHECK_S
        return
    created = context.creation_time
    event = LifecycleEvent(
        xid=context.xid, wid=context.wid, eid=context.eid, old_state=state, new_state=state,
        event_time_ns=time.time_ns(),
        runtime=Runtime(context.cluster or settings.XMC_GKE_CLUSTER, context.namespace, context.name, context.uid,
                        int(created.timestamp() * 1e9) if created else 0),
    )
    try:
        rule.handle(event, artifacts, STORE, persist=False)
    except Exception:
        log.exception("lifecycle.legacy_sync_failed", extra={"xid": context.xid, "wid": context.wid, "eid": context.eid})
        return
    with legacy.lock:
        legacy.synced[key] = wanted
        if len(legacy.synced) > 100_000:
            legacy.synced.pop(next(iter(legacy.synced)))
