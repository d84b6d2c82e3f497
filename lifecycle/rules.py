"""Lifecycle rules: what happens to artifacts when their execution changes state.

A :class:`LifecycleRule` names the artifact payload kinds it handles and the
work unit states it wants to hear about; :func:`registry` is the list of
rules in force, empty while ``XMC_ARTIFACT_LIFECYCLE_ENABLED`` is off (so no
notify-when is stamped and no event is published or handled).

:class:`ManagedXprofRule` mirrors ``managed_xprof`` artifacts as one external
MachineLearningRun per execution (``lifecycle.xprof.mlrun_id``):

* an active state (STARTING, RUNNING) creates the run with ``runPhase
  ACTIVE`` (a run deleted outside XMC is created again), records the console
  URL on the execution (``metadata.mlrun_url``) and persists it as the
  artifacts' ``xprof_url`` in a transaction fenced on ``eid ==
  current_eid``; if that fence fails (a restart won the race) the run just
  created is closed at once;
* a terminal state moves the run to COMPLETED (COMPLETED) or FAILED
  (FAILED, STOPPED; the public SDK also reports a stopped process as
  FAILED); a terminal phase is never changed again;
* updates carry the etag they read; on a conflict (ABORTED, or the older
  FAILED_PRECONDITION) the run is read again and the update retried;
* NotFound on a close path is logged at info and counts as closed; every
  other error of the service is raised, so the event is redelivered;
* a late event for a superseded execution never creates a run and closes
  one that exists; a restart closes the superseded execution's run
  (:meth:`ManagedXprofRule.close_superseded`).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, ClassVar, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from artifacts import xprof
from lifecycle.events import LifecycleEvent, Runtime
from lifecycle.mlrun_client import MLRunClient, MLRunError
from workunits.choices import TERMINAL, WorkUnitState

log = logging.getLogger(__name__)
S = WorkUnitState

ACTIVE_STATES: frozenset[str] = frozenset({S.STARTING, S.RUNNING})
TERMINAL_PHASES: frozenset[str] = frozenset({"COMPLETED", "FAILED"})
#: The run phase each terminal state closes a run with.
TERMINAL_PHASE: dict[str, str] = {S.COMPLETED: "COMPLETED", S.FAILED: "FAILED", S.STOPPED: "FAILED"}
SUPERSEDED_DETAILS = "the execution was superseded by a restart"
#: Read-modify-write attempts on etag conflicts before giving up (the event is then redelivered).
MAX_ATTEMPTS = 5
_CLUSTER_PATH = re.compile(r"^projects/[^/]+/locations/[^/]+/clusters/[^/]+$")


class RunStore(Protocol):
    """The database reads and writes a rule makes, passed in by its caller (``lifecycle.services.STORE``)."""

    def record_run(self, event: LifecycleEvent, url: str, artifacts: Sequence[Any], *, persist: bool = True) -> bool:
        """Record the run's URL; False when ``event.eid`` is no longer the current execution."""

    def current_eid(self, xid: int, wid: int) -> int | None:
        """The work unit's current execution (None when the work unit is gone)."""

    def committed_state(self, xid: int, wid: int, eid: int) -> str:
        """The committed state of execution ``eid`` ("" when there is none)."""

    def experiment_title(self, xid: int) -> str:
        """The experiment's title ("" when it is gone)."""


class LifecycleRule:
    """The interface every rule implements."""

    name: ClassVar[str]
    #: Artifact ``payload_kind`` values the rule handles.
    payload_kinds: ClassVar[frozenset[str]]
    #: Work unit states the rule wants events for (the notify-when union).
    wanted_states: ClassVar[frozenset[str]]

    def handle(self, event: LifecycleEvent, artifacts: Sequence[Any], store: RunStore, *,
               persist: bool = True) -> None:
        """React to ``event`` for the work unit's artifacts of the rule's kinds (idempotent)."""
        raise NotImplementedError

    def close_superseded(self, xid: int, wid: int, eid: int, mlrun_url: str = "") -> None:
        """Execution ``eid`` was superseded by a restart: release what it held."""


def _xprof(artifact: Any) -> dict[str, Any]:
    return dict((artifact.payload or {}).get("managedXprof") or {})


def _rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def cluster_path(cluster: str) -> str:
    """The full GKE cluster path for the request ("" when none is known: never invented)."""
    for candidate in (cluster, settings.XMC_GKE_CLUSTER):
        if candidate and _CLUSTER_PATH.match(candidate):
            return candidate
    return ""


def build_run_request(
    *, xid: int, wid: int, eid: int, artifact: Any, runtime: Runtime, experiment_title: str = ""
) -> dict[str, Any]:
    """The MachineLearningRun to create for execution ``eid`` (the one place the request is built).

    * ``artifacts.gcsPath``: the artifact's run group when it is a GCS folder
      (clients send ``run_group='gs://...'``);
    * ``runSet`` and ``runGroup`` (both, until the service says which wins):
      the folder's last segment (or the run group text), falling back to
      ``xmc-{xid}``; ``displayName``: the artifact's, falling back to the
      experiment title, then the work unit's name;
    * the xprof tool; GKE JobSet workload details with the full cluster path
      and the JobSet's creation time (omitted when no cluster path is known).
    """
    xprof = _xprof(artifact)
    folder = str(xprof.get("runGroup") or "").strip()
    group = folder.rstrip("/").rsplit("/", 1)[-1] if folder.startswith("gs://") else folder
    if folder.startswith("gs://") and group == folder[len("gs://"):].rstrip("/"):
        group = ""  # a bare bucket names no group
    group = group or f"xmc-{xid}"
    display = str(xprof.get("displayName") or "").strip() or experiment_title or f"experiments/{xid}/workUnits/{wid}"
    run: dict[str, Any] = {
        "displayName": display,
        "runSet": group,
        "runGroup": group,
        "orchestrator": "GKE",
        "runPhase": "ACTIVE",
        "tools": [{"xprof": {}}],
        "labels": {"created_by": "xmc", "xmc_xid": str(xid), "xmc_wid": str(wid), "xmc_eid": str(eid)},
    }
    if folder.startswith("gs://"):
        run["artifacts"] = {"gcsPath": folder}
    cluster = cluster_path(runtime.cluster)
    if cluster and runtime.name:
        gke: dict[str, Any] = {"id": runtime.name, "kind": "JobSet", "cluster": cluster,
                               "namespace": runtime.namespace or settings.XMC_K8S_NAMESPACE}
        if runtime.creation_time_ns:
            gke["createTime"] = _rfc3339(runtime.creation_time_ns)
        run["workloadDetails"] = {"gke": gke}
    return run


class ManagedXprofRule(LifecycleRule):
    name = "managed_xprof"
    payload_kinds = frozenset({"managed_xprof"})
    wanted_states = ACTIVE_STATES | TERMINAL

    def __init__(self, client: MLRunClient | None = None) -> None:
        project, location = settings.XMC_MLRUN_PROJECT, settings.XMC_MLRUN_LOCATION
        if client is None:
            missing = [n for n, v in (("XMC_MLRUN_PROJECT", project), ("XMC_MLRUN_LOCATION", location)) if not v]
            if missing:
                raise ImproperlyConfigured(
                    f"XMC_ARTIFACT_LIFECYCLE_ENABLED is on but {' and '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not set: the MachineLearningRun service's project "
                    "and location must be configured (XMC never invents them)"
                )
            client = MLRunClient.from_settings()
        self.client = client

    # --- the event -------------------------------------------------------------------------

    def handle(self, event: LifecycleEvent, artifacts: Sequence[Any], store: RunStore, *,
               persist: bool = True) -> None:
        run_id = xprof.mlrun_id(event.xid, event.wid, event.eid)
        state = event.new_state
        if state in TERMINAL:
            details = "" if state == S.COMPLETED else f"the work unit {state.lower()}"
            run = self.set_phase(run_id, TERMINAL_PHASE[state], error_details=details)
            if run is not None:
                store.record_run(event, self.url(run_id), artifacts, persist=persist)
            return
        if state not in ACTIVE_STATES or not artifacts:
            return
        current = store.current_eid(event.xid, event.wid)
        if current is None:
            return  # the work unit is gone
        if current != event.eid:
            log.info("lifecycle.managed_xprof.late_event", extra={"run_id": run_id, "current_eid": current})
            self.set_phase(run_id, "FAILED", error_details=SUPERSEDED_DETAILS)
            return
        experiment_title = store.experiment_title(event.xid)
        request = build_run_request(xid=event.xid, wid=event.wid, eid=event.eid, artifact=artifacts[0],
                                    runtime=event.runtime, experiment_title=experiment_title)
        self.set_phase(run_id, "ACTIVE", create=request)
        if not store.record_run(event, self.url(run_id), artifacts, persist=persist):
            # A restart committed while the run was being created: close it at once.
            log.info("lifecycle.managed_xprof.superseded_after_create", extra={"run_id": run_id})
            self.set_phase(run_id, "FAILED", error_details=SUPERSEDED_DETAILS)
            return
        # Events of one execution may run concurrently (or out of order): a
        # terminal event handled before this create found no run and counted
        # it as closed. Its state was committed before it was published, so
        # reading the committed state *after* the create closes the run.
        committed = store.committed_state(event.xid, event.wid, event.eid)
        if committed in TERMINAL_PHASE:
            details = "" if committed == S.COMPLETED else f"the work unit {committed.lower()}"
            self.set_phase(run_id, TERMINAL_PHASE[committed], error_details=details)

    def close_superseded(self, xid: int, wid: int, eid: int, mlrun_url: str = "") -> None:
        run_id = xprof.parse_run_id(mlrun_url) or xprof.mlrun_id(xid, wid, eid)
        self.set_phase(run_id, "FAILED", error_details=SUPERSEDED_DETAILS)

    def url(self, run_id: str) -> str:
        return xprof.console_url(self.client.project, self.client.location, run_id)

    # --- the run ---------------------------------------------------------------------------

    def set_phase(
        self, run_id: str, phase: str, *, create: dict[str, Any] | None = None, error_details: str = ""
    ) -> dict[str, Any] | None:
        """Move run ``run_id`` to ``phase`` (never out of a terminal phase); the run, or None when gone.

        ``create``: the request to create the run with when it does not exist
        (the active path); without it a missing run counts as closed.
        """
        for _ in range(MAX_ATTEMPTS):
            try:
                run = self.client.get(run_id)
            except MLRunError as exc:
                if not exc.not_found:
                    raise
                if create is None:
                    log.info("lifecycle.managed_xprof.not_found_treated_as_closed", extra={"run_id": run_id})
                    return None
                try:
                    created = self.client.create(run_id, create)
                    log.info("lifecycle.managed_xprof.created", extra={"run_id": run_id})
                    return created
                except MLRunError as exc2:
                    if exc2.already_exists:
                        continue  # created concurrently (or by an earlier delivery): read it again
                    raise
            current = str(run.get("runPhase") or "RUN_PHASE_UNSPECIFIED")
            if current in TERMINAL_PHASES or current == phase:
                return run  # never backwards, never from one terminal phase to another
            run["runPhase"] = phase
            if error_details and phase == "FAILED":
                run["errorDetails"] = error_details
            try:
                updated = self.client.update(run)
                log.info("lifecycle.managed_xprof.phase", extra={"run_id": run_id, "phase": phase})
                return updated
            except MLRunError as exc:
                if exc.etag_conflict:
                    log.info("lifecycle.managed_xprof.etag_conflict", extra={"run_id": run_id})
                    continue
                if exc.not_found:
                    if create is None:
                        log.info("lifecycle.managed_xprof.not_found_treated_as_closed", extra={"run_id": run_id})
                        return None
                    continue  # deleted outside XMC between read and write: create it again
                raise
        raise MLRunError("ABORTED", f"run {run_id}: still conflicting after {MAX_ATTEMPTS} attempts")


_cache: tuple[tuple[Any, ...], list[LifecycleRule]] | None = None


def registry() -> list[LifecycleRule]:
    """The rules in force: none while the flag is off."""
    global _cache
    if not settings.XMC_ARTIFACT_LIFECYCLE_ENABLED:
        return []
    key = (settings.XMC_MLRUN_PROJECT, settings.XMC_MLRUN_LOCATION, settings.XMC_MLRUN_ENDPOINT,
           settings.XMC_MLRUN_TOKEN)
    if _cache is None or _cache[0] != key:
        _cache = (key, [ManagedXprofRule()])
    return _cache[1]


def check_configuration() -> None:
    """Raise ``ImproperlyConfigured`` when the rules in force cannot run (called at start-up)."""
    registry()
