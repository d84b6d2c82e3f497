"""The reconciler: watch our JobSets, their Workloads and Pods, keep every execution's state true.

``manage.py reconcile`` (``k8s_bridge.management.commands.reconcile``) runs a
:class:`Reconciler` while it holds the leader lease. Per watched namespace
three :class:`~k8s_bridge.reconciler.watchers.Informer` threads keep the
latest JobSets (label selector on the xmc labels), Workloads and Pods. Any
change marks the owning JobSet *dirty*; one worker thread takes the dirty
keys and, for each, reads the current objects from the caches, maps them
(``k8s_bridge.reconciler.mapping.observe``) and:

* for a JobSet being deleted, runs the **finalizer path** synchronously: the
  terminal state (rule 1) is written in its own transaction, then our
  finalizer is removed with a JSON patch guarded by the resourceVersion
  (``test`` op). A fenced write (older execution) or a missing work unit
  still removes it; a write that keeps failing is retried until
  ``XMC_MAX_STOPPED_WRITE_RETRY_AGE_S`` and then given up on, so a deletion
  can never hang forever;
* otherwise puts masked updates into the
  :class:`~k8s_bridge.reconciler.batcher.UpdateBatcher`: slot ``jobset``
  carries the state with ``detailed_status`` and ``scheduling_information``
  (in the *same* update, so queue information can never outlive SCHEDULING,
  even within one flush), slot ``pods`` the ERROR diagnostics. Execution
  metadata (where it runs) is written separately and only when it changes.

Every ``resync_s`` the JobSets are listed again, every key is recomputed and
the orphan sweep (``k8s_bridge.reconciler.sweep``) repairs what no event
will. ``can_write`` (the lease) is checked before every write.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from core import convert
from k8s_bridge import client
from k8s_bridge.logs import archive as logarchive
from k8s_bridge.logs import pods as podlogs
from k8s_bridge.reconciler import mapping, metrics, sweep
from k8s_bridge.reconciler.batcher import UpdateBatcher
from core.keys import ExecutionKey
from k8s_bridge.reconciler.mapping import Observation, QueuePosition
from k8s_bridge.reconciler.watchers import Informer, Key, Kind, Obj, key_of
from lifecycle import hooks
from workunits import hooks as workunit_hooks
from workunits import services
from workunits import state as guards
from workunits.choices import WorkUnitState, Writer
from workunits.models import WorkUnitExecution
from workunits.services import Transition

log = logging.getLogger(__name__)
S = WorkUnitState

JOBSETS = Kind("jobsets", client.JOBSET_GROUP, client.JOBSET_VERSION, client.JOBSET_PLURAL,
               label_selector=mapping.JOBSET_SELECTOR)
WORKLOADS = Kind("workloads", client.KUEUE_GROUP, client.KUEUE_VERSION, client.WORKLOAD_PLURAL,
                 fallback_versions=("v1beta1",))
PODS = Kind("pods", label_selector=mapping.JOBSET_NAME_LABEL)


@dataclass(frozen=True)
class Options:
    namespaces: tuple[str, ...]
    flush_interval_s: float = 0.2
    max_batch: int = 500
    resync_s: float = 300.0
    grace_s: float = 120.0
    max_stopped_write_retry_age_s: float = 600.0
    position_refresh_s: float = 5.0
    watch_timeout_s: int = 30
    cluster_name: str = ""
    write_connections: int = 1

    @classmethod
    def from_settings(cls, namespaces: Sequence[str] = ()) -> Options:
        return cls(
            namespaces=tuple(namespaces) or (settings.XMC_K8S_NAMESPACE,),
            flush_interval_s=settings.XMC_RECONCILER_FLUSH_INTERVAL_MS / 1000.0,
            max_batch=settings.XMC_RECONCILER_MAX_BATCH,
            resync_s=float(settings.XMC_RECONCILER_RESYNC_S),
            grace_s=float(settings.XMC_STARTUP_IMAGE_PULL_GRACE_S),
            max_stopped_write_retry_age_s=float(settings.XMC_MAX_STOPPED_WRITE_RETRY_AGE_S),
            cluster_name=settings.XMC_K8S_CLUSTER_NAME,
            write_connections=settings.XMC_RECONCILER_WRITE_CONNECTIONS,
        )


def _writer(updates: Sequence[guards.ExecutionUpdate]) -> list[Transition]:
    return services.update_work_unit_executions(updates)


class Reconciler:
    def __init__(
        self,
        options: Options,
        *,
        can_write: Callable[[], bool] = lambda: True,
        write: Callable[[Sequence[guards.ExecutionUpdate]], list[Transition]] | None = None,
        now: Callable[[], datetime] = timezone.now,
        archiver: logarchive.Archiver | None = None,
        archive_logs: bool = True,
    ) -> None:
        self.options = options
        self.can_write = can_write
        self._now = now
        self._write = write or _writer
        self.batcher = UpdateBatcher(
            self._write, flush_interval_s=options.flush_interval_s, max_batch=options.max_batch,
            on_committed=self._on_committed, can_write=can_write, connections=options.write_connections,
        )
        self.jobsets: dict[str, Informer] = {}
        self.workloads: dict[str, Informer] = {}
        self.pods: dict[str, Informer] = {}
        for ns in options.namespaces:
            common: dict[str, Any] = {"watch_timeout_s": options.watch_timeout_s}
            # JobSets are relisted by the resync loop (DB snapshot first, then the list, then the sweep).
            self.jobsets[ns] = Informer(JOBSETS, ns, self._on_change, resync_s=1e12, **common)
            self.workloads[ns] = Informer(WORKLOADS, ns, self._on_change, resync_s=options.resync_s, **common)
            self.pods[ns] = Informer(PODS, ns, self._on_change, resync_s=options.resync_s, **common)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._dirty: dict[Key, float] = {}  # key -> monotonic time first marked (lag)
        self._retry_at: dict[Key, float] = {}
        self._workload_by_owner: dict[str, Key] = {}
        self._workload_by_uid: dict[str, Key] = {}
        self._pods_by_jobset: dict[Key, set[Key]] = {}
        self._last_put: dict[Key, tuple[Any, ...]] = {}
        self._last_state: dict[Key, str] = {}
        self._waiting_seen: dict[str, str] = {}
        self._deleted_pods: dict[Key, dict[str, Obj]] = {}
        self._metadata_written: dict[ExecutionKey, dict[str, Any]] = {}
        self._metadata_pending: dict[ExecutionKey, dict[str, Any]] = {}
        self._contexts: dict[tuple[int, int, int], hooks.JobSetContext] = {}
        self._finalize_failing_since: dict[str, float] = {}
        self._positions: dict[str, tuple[float, dict[tuple[str, str], QueuePosition]]] = {}
        self._cluster_queues: dict[tuple[str, str], tuple[float, str]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.resyncs = 0
        # Container logs are archived on the archiver's own thread and connection (a side
        # path: nothing here or in the batcher waits for it; k8s_bridge.logs.archive).
        self.archiver = archiver if archiver is not None else (
            logarchive.Archiver(can_write=can_write) if archive_logs else None)
        if self.archiver is not None and self.archiver.on_archived is None:
            self.archiver.on_archived = self._on_archived
        self._jobs: dict[str, tuple[tuple[Any, ...], list[Obj]]] = {}
        self._finalize_written: dict[str, float] = {}
        self._finalize_tailed: set[str] = set()

    # --- events -> dirty keys ---------------------------------------------------------------

    def _mark(self, key: Key, *, delay: float = 0.0) -> None:
        with self._wake:
            if delay:
                self._retry_at[key] = min(self._retry_at.get(key, float("inf")), time.monotonic() + delay)
            else:
                self._dirty.setdefault(key, time.monotonic())
            self._wake.notify()

    def _on_change(self, kind: str, event_type: str, obj: Obj) -> None:
        md = obj.get("metadata") or {}
        ns = str(md.get("namespace") or "")
        if kind == "jobsets":
            key = key_of(obj)
            if event_type == "DELETED":
                ek = mapping.execution_key(obj)
                with self._lock:
                    self._last_put.pop(key, None)
                    self._last_state.pop(key, None)
                    self._dirty.pop(key, None)
                    self._deleted_pods.pop(key, None)
                    self._waiting_seen.pop(str(md.get("uid")), None)
                    self._jobs.pop(str(md.get("uid")), None)
                    self._finalize_written.pop(str(md.get("uid")), None)
                    self._finalize_tailed.discard(str(md.get("uid")))
                    if ek is not None:
                        self._metadata_written.pop(ek, None)
                        if self.archiver is not None:
                            self.archiver.forget(ek.xid, ek.wid, ek.eid)
                        self._contexts.pop((ek.xid, ek.wid, ek.eid), None)
                return
            self._mark(key)
        elif kind == "workloads":
            owner = next((r for r in md.get("ownerReferences") or () if r.get("kind") == "JobSet"), None)
            with self._lock:
                if event_type == "DELETED":
                    self._workload_by_uid.pop(str(md.get("uid")), None)
                    if owner is not None and self._workload_by_owner.get(str(owner.get("uid"))) == key_of(obj):
                        self._workload_by_owner.pop(str(owner.get("uid")), None)
                else:
                    self._workload_by_uid[str(md.get("uid"))] = key_of(obj)
                    if owner is not None:
                        self._workload_by_owner[str(owner.get("uid"))] = key_of(obj)
            if owner is not None:
                self._mark((ns, str(owner.get("name"))))
        elif kind == "pods":
            js_name = str((md.get("labels") or {}).get(mapping.JOBSET_NAME_LABEL) or "")
            if not js_name:
                return
            js_key = (ns, js_name)
            phase = (obj.get("status") or {}).get("phase")
            owner = self.jobsets[ns].get(js_key) if ns in self.jobsets else None
            # Pods deleted by a suspension (preemption) or with their JobSet are not failures.
            counted = owner is not None and not (owner.get("spec") or {}).get("suspend") and not (
                owner.get("metadata") or {}).get("deletionTimestamp")
            with self._lock:
                members = self._pods_by_jobset.setdefault(js_key, set())
                if event_type == "DELETED":
                    members.discard(key_of(obj))
                else:
                    members.add(key_of(obj))
                if counted and (event_type == "DELETED" or md.get("deletionTimestamp")) and phase != "Succeeded":
                    # The Job controller counts it as failed; remember it to explain a failure later.
                    self._deleted_pods.setdefault(js_key, {})[str(md.get("name"))] = obj
            self._mark(js_key)

    # --- one JobSet -----------------------------------------------------------------------

    def _workload_for(self, jobset: Obj) -> Obj | None:
        md = jobset.get("metadata") or {}
        with self._lock:
            key = self._workload_by_owner.get(str(md.get("uid")))
        if key is None:
            return None
        return self.workloads[key[0]].get(key)

    def _pods_for(self, key: Key) -> list[Obj]:
        with self._lock:
            members = list(self._pods_by_jobset.get(key, ()))
        informer = self.pods.get(key[0])
        if informer is None:
            return []
        return [p for p in (informer.get(k) for k in members) if p is not None]

    def _deleted_for(self, key: Key, jobset_uid: str) -> list[Obj]:
        """Pods of this JobSet (this incarnation: same UID) deleted before they succeeded."""
        with self._lock:
            pods = list(self._deleted_pods.get(key, {}).values())
        return [p for p in pods
                if ((p.get("metadata") or {}).get("labels") or {}).get("jobset.sigs.k8s.io/jobset-uid", jobset_uid)
                == jobset_uid]

    def _context(self, jobset: Obj, ek: ExecutionKey) -> hooks.JobSetContext:
        md = jobset.get("metadata") or {}
        context = hooks.JobSetContext(
            xid=ek.xid, wid=ek.wid, eid=ek.eid, namespace=str(md.get("namespace", "")), name=str(md.get("name", "")),
            uid=str(md.get("uid", "")), creation_time=mapping.parse_time(md.get("creationTimestamp")),
            notify_when=str((md.get("annotations") or {}).get(mapping.NOTIFY_WHEN_ANNOTATION, "")),
            cluster=self.options.cluster_name,
        )
        with self._lock:
            self._contexts[(ek.xid, ek.wid, ek.eid)] = context
        return context

    def reconcile_key(self, key: Key, seen: float | None = None) -> Observation | None:
        informer = self.jobsets.get(key[0])
        jobset = informer.get(key) if informer is not None else None
        if jobset is None:
            return None
        ek = mapping.execution_key(jobset)
        if ek is None:
            return None
        if (jobset.get("metadata") or {}).get("deletionTimestamp"):
            self._finalize(key, jobset, ek)
            return None
        workload = self._workload_for(jobset)
        pods = self._pods_for(key)
        uid = str((jobset.get("metadata") or {}).get("uid", ""))
        waiting = mapping.waiting_summary(pods)
        if waiting:
            self._waiting_seen[uid] = waiting
        position = None
        preemptor_priority = None
        if mapping.to_work_unit_state(jobset) == S.SCHEDULING and workload is not None:
            position = self._position(workload)
            evicted = mapping.find_condition(workload, "Evicted")
            if evicted is not None and evicted.get("reason") == "Preempted":
                preemptor_priority = self._priority_of(mapping.preemptor_uid(str(evicted.get("message") or "")))
        self._archive(ek, jobset, pods)
        deleted = self._deleted_for(key, uid)
        failing = mapping.to_work_unit_state(jobset) in (S.FAILED, S.PARTIALLY_FAILED)
        observation = mapping.observe(
            jobset, workload, pods, now=self._now(), grace=timedelta(seconds=self.options.grace_s),
            position=position, preemptor_priority=preemptor_priority,
            waiting_on=waiting or self._waiting_seen.get(uid, ""), cluster_name=self.options.cluster_name,
            deleted_pods=deleted, jobs=self._jobs_for(jobset) if failing else (),
            tails=self._tails([*pods, *deleted]) if failing else None,
        )
        if observation is None:
            return None
        hooks.on_jobset_observed(self._context(jobset, ek), observation.state)
        self._put(key, observation, seen)
        return observation

    def _put(self, key: Key, obs: Observation, seen: float | None) -> None:
        fingerprint = (obs.key, obs.state, repr(obs.detailed_status), repr(obs.scheduling_information),
                       repr(obs.system_message))
        with self._lock:
            self._last_state[key] = obs.state
            unchanged = self._last_put.get(key) == fingerprint
            self._last_put[key] = fingerprint
            if self._metadata_written.get(obs.key) != obs.metadata:
                self._metadata_pending[obs.key] = obs.metadata
        if unchanged:
            return
        now_ns = convert.ns_from_datetime(self._now())
        self.batcher.put("jobset", guards.ExecutionUpdate(
            xid=obs.key.xid, wid=obs.key.wid, eid=obs.key.eid,
            mask=(guards.STATE, guards.DETAILED_STATUS, guards.SCHEDULING_INFORMATION),
            state=obs.state, state_update_time_ns=now_ns, detailed_status=obs.detailed_status,
            scheduling_information=obs.scheduling_information, writer=Writer.RECONCILER,
            extra={"jobset": key[1], "resourceVersion": obs.resource_version},
        ), seen=seen)
        if obs.system_message is not None:
            self.batcher.put("pods", guards.ExecutionUpdate(
                xid=obs.key.xid, wid=obs.key.wid, eid=obs.key.eid, mask=(guards.SYSTEM_MESSAGE,),
                system_message=obs.system_message, force_status_message_update=obs.force_message,
                writer=Writer.RECONCILER, extra={"jobset": key[1]},
            ), seen=seen)

    # --- container logs and the Jobs behind a failure ----------------------------------------

    def _archive(self, ek: ExecutionKey, jobset: Obj, pods: Sequence[Obj], *, snapshot: bool = False) -> None:
        """Hand the pods to the archiver (only queues keys; never blocks on I/O)."""
        if self.archiver is None:
            return
        per_job = podlogs.pods_per_job(jobset)
        going = [p for p in pods if (p.get("metadata") or {}).get("deletionTimestamp")]
        self.archiver.observe(ek.xid, ek.wid, ek.eid, pods, per_job=per_job, snapshot=snapshot)
        if going and not snapshot:
            self.archiver.observe(ek.xid, ek.wid, ek.eid, going, per_job=per_job, snapshot=True)

    def _on_archived(self, inst: logarchive.Instance, row: Any) -> None:
        """A log was archived: look at its JobSet again (a failure message gains its last lines)."""
        self._mark((inst.namespace, podlogs.jobset_name(inst.xid, inst.wid)))

    def _tails(self, pods: Sequence[Obj]) -> dict[tuple[str, str], tuple[int, list[str], int | None, str]]:
        if self.archiver is None:
            return {}
        out = {}
        for pod in pods:
            md = pod.get("metadata") or {}
            for container, held in self.archiver.tails(str(md.get("uid") or "")).items():
                out[(str(md.get("name") or ""), container)] = held
        return out

    def _jobs_for(self, jobset: Obj) -> list[Obj]:
        """The JobSet's Jobs (for their failure reasons), read once per JobSet status; [] if unreadable."""
        md = jobset.get("metadata") or {}
        uid = str(md.get("uid") or "")
        status = jobset.get("status") or {}
        version = (status.get("restarts"), repr(status.get("replicatedJobsStatus")),
                   repr([c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"]))
        cached = self._jobs.get(uid)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            result = client.batch().list_namespaced_job(
                str(md.get("namespace") or ""), label_selector=f"{podlogs.JOBSET_UID_LABEL}={uid}", _request_timeout=10)
            jobs = list(client.api_client().sanitize_for_serialization(result).get("items") or [])
        except Exception:  # noqa: BLE001 - the explanation goes without the Jobs' reasons
            log.debug("reconciler.jobs_unreadable", exc_info=True)
            return cached[1] if cached is not None else []
        self._jobs[uid] = (version, jobs)
        return jobs

    def _priority_of(self, workload_uid: str) -> int | None:
        if not workload_uid:
            return None
        with self._lock:
            key = self._workload_by_uid.get(workload_uid)
        wl = self.workloads[key[0]].get(key) if key is not None and key[0] in self.workloads else None
        if wl is None:
            return None
        priority = (wl.get("spec") or {}).get("priority")
        return int(priority) if priority is not None else None

    # --- queue position (Kueue visibility API) -------------------------------------------------

    def _cluster_queue(self, namespace: str, local_queue: str) -> str:
        cached = self._cluster_queues.get((namespace, local_queue))
        if cached is not None and time.monotonic() - cached[0] < 60:
            return cached[1]
        version = self.workloads[namespace].version if namespace in self.workloads else client.KUEUE_VERSION
        lq = client.custom_objects().get_namespaced_custom_object(
            client.KUEUE_GROUP, version, namespace, "localqueues", local_queue, _request_timeout=10
        )
        cq = str((lq.get("spec") or {}).get("clusterQueue") or "")
        self._cluster_queues[(namespace, local_queue)] = (time.monotonic(), cq)
        return cq

    def _position(self, workload: Obj) -> QueuePosition | None:
        if mapping.condition_true(workload, "QuotaReserved"):
            return None
        md = workload.get("metadata") or {}
        namespace = str(md.get("namespace") or "")
        queue = str((workload.get("spec") or {}).get("queueName") or "")
        if not queue:
            return None
        try:
            cq = self._cluster_queue(namespace, queue)
            cached = self._positions.get(cq)
            if cached is None or time.monotonic() - cached[0] > min(1.0, self.options.position_refresh_s / 2):
                body = client.get_json(client.VISIBILITY_PATH, {"cq": cq})
                items = body.get("items") or []
                table = {
                    (str(i["metadata"].get("namespace") or ""), str(i["metadata"]["name"])):
                        QueuePosition(int(i.get("positionInClusterQueue", n)) + 1, len(items))
                    for n, i in enumerate(items)
                }
                cached = (time.monotonic(), table)
                self._positions[cq] = cached
        except Exception:  # the visibility API is optional (pitfall 6.13): no position then
            log.debug("reconciler.visibility_unavailable", exc_info=True)
            return None
        return cached[1].get((namespace, str(md.get("name"))))

    # --- the finalizer path ---------------------------------------------------------------

    def _finalize(self, key: Key, jobset: Obj, ek: ExecutionKey) -> None:
        md = jobset.get("metadata") or {}
        finalizers = list(md.get("finalizers") or ())
        if mapping.FINALIZER not in finalizers:
            return
        if not self.can_write():
            return
        uid = str(md.get("uid", ""))
        state = mapping.to_work_unit_state(jobset)
        pods = self._pods_for(key)
        # Before the finalizer lets the JobSet (and so its pods) go, their logs are archived.
        self._archive(ek, jobset, pods, snapshot=True)
        if uid in self._finalize_written:
            if not self._logs_settled(key, jobset, uid, pods):
                return
            if state == S.FAILED:
                self._write_failure_tail(key, jobset, ek, uid, pods)
            self._remove_finalizer(key, jobset, ek, state, "written")
            return
        mask: tuple[str, ...] = (guards.STATE, guards.DETAILED_STATUS, guards.SCHEDULING_INFORMATION)
        deleted = self._deleted_for(key, uid)
        message = (mapping.failure_explanation(pods, deleted, jobset=jobset, jobs=self._jobs_for(jobset),
                                               tails=self._tails([*pods, *deleted]),
                                               waited_on=self._waiting_seen.get(uid, ""))
                   if state == S.FAILED else None)
        if message is not None:
            mask += (guards.SYSTEM_MESSAGE,)
        update = guards.ExecutionUpdate(
            xid=ek.xid, wid=ek.wid, eid=ek.eid, mask=mask, state=state,
            state_update_time_ns=self._terminal_time_ns(ek), detailed_status=mapping.jobset_status(jobset),
            scheduling_information=None, system_message=message, force_status_message_update=message is not None,
            writer=Writer.FINALIZER, extra={"jobset": key[1], "uid": uid},
        )
        why = "written"
        try:
            transitions = self._write([update])
        except Exception:
            close_old_connections()
            first = self._finalize_failing_since.setdefault(uid, time.monotonic())
            age = time.monotonic() - first
            if age < self.options.max_stopped_write_retry_age_s:
                log.exception("reconciler.finalizer_write_failed", extra={"jobset": key[1], "age_s": round(age, 1)})
                self._mark(key, delay=min(5.0, 0.2 * 2 ** min(8, int(age))))
                return
            log.error("reconciler.finalizer_write_given_up", extra={"jobset": key[1], "age_s": round(age, 1)})
            why = "gave_up"
            transitions = []
        self._finalize_failing_since.pop(uid, None)
        if transitions:
            self._publish(transitions, [self._context(jobset, ek)])
        self._finalize_written[uid] = time.monotonic()
        if message is not None and "auxiliaryInfo" in message:
            self._finalize_tailed.add(uid)
        if not self._logs_settled(key, jobset, uid, pods):
            return
        if state == S.FAILED:
            self._write_failure_tail(key, jobset, ek, uid, pods)
        self._remove_finalizer(key, jobset, ek, state, why)

    def _write_failure_tail(self, key: Key, jobset: Obj, ek: ExecutionKey, uid: str, pods: Sequence[Obj]) -> None:
        """The failure message again, now with the archived last lines (once; best effort)."""
        if uid in self._finalize_tailed:
            return
        self._finalize_tailed.add(uid)
        deleted = self._deleted_for(key, uid)
        message = mapping.failure_explanation(pods, deleted, jobset=jobset, jobs=self._jobs_for(jobset),
                                              tails=self._tails([*pods, *deleted]),
                                              waited_on=self._waiting_seen.get(uid, ""))
        if message is None or "auxiliaryInfo" not in message:
            return
        try:
            self._write([guards.ExecutionUpdate(
                xid=ek.xid, wid=ek.wid, eid=ek.eid, mask=(guards.SYSTEM_MESSAGE,), system_message=message,
                force_status_message_update=True, writer=Writer.FINALIZER, extra={"jobset": key[1], "uid": uid},
            )])
        except Exception:
            close_old_connections()
            log.exception("reconciler.failure_tail_write_failed", extra={"jobset": key[1]})

    def _logs_settled(self, key: Key, jobset: Obj, uid: str, pods: Sequence[Obj]) -> bool:
        """The pods' logs are archived, or we waited ``XMC_LOG_ARCHIVE_FINALIZER_WAIT_S`` (the state is written)."""
        if self.archiver is None:
            return True
        uids = [str((p.get("metadata") or {}).get("uid") or "") for p in pods]
        if self.archiver.settled(uids):
            return True
        waited = time.monotonic() - self._finalize_written.get(uid, time.monotonic())
        if waited >= float(settings.XMC_LOG_ARCHIVE_FINALIZER_WAIT_S):
            log.warning("reconciler.finalizer_logs_not_archived", extra={"jobset": key[1], "waited_s": round(waited, 1)})
            return True
        self._mark(key, delay=0.25)
        return False

    def _remove_finalizer(self, key: Key, jobset: Obj, ek: ExecutionKey, state: str, why: str) -> None:
        md = jobset.get("metadata") or {}
        finalizers = list(md.get("finalizers") or ())
        if not self.can_write():
            return
        remaining = [f for f in finalizers if f != mapping.FINALIZER]
        try:
            client.json_patch(
                client.JOBSET_GROUP, self.jobsets[key[0]].version, key[0], client.JOBSET_PLURAL, key[1],
                [{"op": "test", "path": "/metadata/resourceVersion", "value": md.get("resourceVersion")},
                 {"op": "replace", "path": "/metadata/finalizers", "value": remaining}],
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return
            if exc.status in (409, 422):  # changed since we read it: the next event brings it back
                self._mark(key, delay=0.05)
                return
            raise
        metrics.FINALIZERS.labels(why).inc()
        log.info("reconciler.finalizer_removed", extra={"jobset": key[1], "xid": ek.xid, "wid": ek.wid,
                                                         "eid": ek.eid, "state": state, "why": why})

    def _terminal_time_ns(self, ek: ExecutionKey, floor_ns: int = 0) -> int:
        """The time of a terminal write from the finalizer path or the sweep.

        These writes are the last word on an execution whose JobSet is going
        or gone, so they must not be dropped as stale because this host's clock
        runs behind the state server that wrote STOPPING: never earlier than
        the stored state's time.
        """
        now_ns = convert.ns_from_datetime(self._now())
        if not floor_ns:
            stored = (WorkUnitExecution.objects
                      .filter(work_unit__experiment_id=ek.xid, work_unit__wid=ek.wid, eid=ek.eid)
                      .values_list("state_update_time_ns", flat=True).first())
            floor_ns = int(stored or 0)
        return max(now_ns, floor_ns + 1)

    # --- after commit ----------------------------------------------------------------------------

    def _publish(self, transitions: Sequence[Transition], extra: Iterable[hooks.JobSetContext] = ()) -> None:
        with self._lock:
            contexts = dict(self._contexts)
        for c in extra:
            contexts[(c.xid, c.wid, c.eid)] = c
        wanted = {(t.xid, t.wid, t.eid): contexts[(t.xid, t.wid, t.eid)]
                  for t in transitions if (t.xid, t.wid, t.eid) in contexts}
        try:
            hooks.on_transitions_committed(transitions, wanted)
        except Exception:
            log.exception("reconciler.hook_failed")
        workunit_hooks.on_transitions_committed(transitions)  # the apps above (notifications); logs its failures

    def _on_committed(self, transitions: list[Transition], updates: list[guards.ExecutionUpdate]) -> None:
        if transitions:
            self._publish(transitions)

    def flush_metadata(self) -> None:
        with self._lock:
            pending = dict(self._metadata_pending)
        if not pending or not self.can_write():
            return
        try:
            services.record_execution_metadata([(k.xid, k.wid, k.eid, v) for k, v in sorted(pending.items())])
        except Exception:
            close_old_connections()
            log.exception("reconciler.metadata_write_failed", extra={"pending": len(pending)})
            return
        with self._lock:
            for k, v in pending.items():
                self._metadata_written[k] = v
                if self._metadata_pending.get(k) == v:
                    del self._metadata_pending[k]

    # --- resync and sweep -------------------------------------------------------------------

    def resync(self) -> list[sweep.Repair]:
        """DB snapshot, then a full list of JobSets, recompute every key, repair orphans."""
        snap = sweep.snapshot(self.options.namespaces[0] if len(self.options.namespaces) == 1
                              else settings.XMC_K8S_NAMESPACE)
        listed: list[Obj] = []
        for informer in self.jobsets.values():
            listed.extend(informer.relist("resync"))
        with self._lock:
            self._last_put.clear()  # re-put everything once per resync (level-triggered backstop)
        for js in listed:
            self._mark(key_of(js))
        repairs = sweep.recheck(sweep.plan(snap, listed, self.options.namespaces))
        self._repair(repairs)
        self.resyncs += 1
        return repairs

    def _repair(self, repairs: Sequence[sweep.Repair]) -> None:
        if not repairs or not self.can_write():
            return
        updates = []
        for r in repairs:
            metrics.SWEEP.labels(r.case).inc()
            log.warning("reconciler.orphan", extra={"case": r.case, "xid": r.key.xid, "wid": r.key.wid,
                                                    "eid": r.key.eid})
            if r.jobset is not None:
                namespace, name, uid = r.jobset
                try:
                    client.custom_objects().delete_namespaced_custom_object(
                        client.JOBSET_GROUP, self.jobsets[namespace].version, namespace, client.JOBSET_PLURAL, name,
                        body={"preconditions": {"uid": uid}, "propagationPolicy": "Background"},
                        _request_timeout=15,
                    )
                except client.ApiException as exc:
                    if exc.status not in (404, 409):
                        log.exception("reconciler.orphan_delete_failed", extra={"jobset": name})
                continue
            mask: tuple[str, ...] = (guards.STATE,)
            message = None
            if r.message:
                mask += (guards.SYSTEM_MESSAGE,)
                message = {"severity": "ERROR", "source": "XMANAGER_BACKEND", "userFacingText": r.message}
            updates.append(guards.ExecutionUpdate(
                xid=r.key.xid, wid=r.key.wid, eid=r.key.eid, mask=mask, state=r.state,
                state_update_time_ns=self._terminal_time_ns(r.key, r.state_update_time_ns),
                system_message=message, force_status_message_update=True, messages_need_state=True,
                writer=Writer.SWEEP,
                extra={"case": r.case},
            ))
        if updates:
            transitions = self._write(updates)
            self._publish(transitions)

    # --- threads ---------------------------------------------------------------------------------

    def process_dirty(self) -> int:
        """Reconcile every key marked dirty so far (and retries that are due); returns how many."""
        now = time.monotonic()
        with self._lock:
            due = [k for k, at in self._retry_at.items() if at <= now]
            for k in due:
                del self._retry_at[k]
                self._dirty.setdefault(k, now)
            batch = self._dirty
            self._dirty = {}
        for key, seen in batch.items():
            if self._stop.is_set():
                break
            try:
                self.reconcile_key(key, seen)
            except Exception:
                close_old_connections()
                log.exception("reconciler.reconcile_failed", extra={"jobset": key[1]})
                self._mark(key, delay=1.0)
        return len(batch)

    def _worker(self) -> None:
        try:
            self._work()
        finally:
            connection.close()  # this thread's own database connection

    def _work(self) -> None:
        last_positions = time.monotonic()
        last_metadata = 0.0
        while not self._stop.is_set():
            with self._wake:
                if not self._dirty:
                    self._wake.wait(0.1)
            self.process_dirty()
            now = time.monotonic()
            if now - last_metadata >= self.options.flush_interval_s:
                last_metadata = now
                self.flush_metadata()
            if now - last_positions >= self.options.position_refresh_s:
                last_positions = now
                # Queue positions move without any event on our objects: look again (an
                # unchanged position is not written: the observation fingerprint is the same).
                with self._lock:
                    scheduling = [k for k, s in self._last_state.items() if s == S.SCHEDULING]
                for k in scheduling:
                    self._mark(k)

    def _resync_loop(self) -> None:
        while not self._stop.wait(self.options.resync_s):
            try:
                self.resync()
            except Exception:
                close_old_connections()
                log.exception("reconciler.resync_failed")
        connection.close()

    def start(self, *, sync_timeout: float = 60.0) -> None:
        """Start informers, wait for their first lists, run one resync (with sweep), start the loops."""
        for group in (self.workloads, self.pods, self.jobsets):
            for informer in group.values():
                informer.start()
        deadline = time.monotonic() + sync_timeout
        for group in (self.workloads, self.pods, self.jobsets):
            for informer in group.values():
                informer.synced.wait(max(0.0, deadline - time.monotonic()))
        self.batcher.start()
        if self.archiver is not None:
            self.archiver.start()
        for target, name in ((self._worker, "reconciler-worker"), (self._resync_loop, "reconciler-resync")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        try:
            self.resync()
        except Exception:
            log.exception("reconciler.initial_resync_failed")

    def run_once(self) -> list[sweep.Repair]:
        """``--once``: list everything, reconcile every JobSet, sweep, flush, return."""
        for group in (self.workloads, self.pods):
            for informer in group.values():
                informer.relist("start")
        repairs = self.resync()
        self.process_dirty()
        if self.archiver is not None:
            self.archiver.drain()
            # Finalizers that waited for those archives are due again shortly.
            with self._lock:
                waiting = bool(self._retry_at)
            if waiting:
                time.sleep(0.3)
                self.process_dirty()
        # Writes what is pending (retrying a failed flush until the drain timeout), then
        # closes the batcher's writer threads and their database connections.
        self.batcher.stop(drain=True)
        self.flush_metadata()
        return repairs

    def stop(self, *, drain: bool = True) -> None:
        """Stop the loops; with ``drain`` write what is pending, else forget it (lease lost)."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        for group in (self.jobsets, self.workloads, self.pods):
            for informer in group.values():
                informer.stop()
        for thread in self._threads:
            thread.join(10)
        if self.archiver is not None:
            self.archiver.stop()
        if not drain:
            self.batcher.discard()
        self.batcher.stop(drain=drain)
        if drain:
            self.flush_metadata()
