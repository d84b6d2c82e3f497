"""Simulated cluster controllers: JobSet, batch Job, kubelet, Kueue.

Entry point: `start_controllers(store, clock, config_path)`, called by the
`python -m simulators.cluster` entry point (and the tests) after creating the
`simulators.cluster.store.Store` and the `simulators.cluster.clock.SimClock`.  It
loads the queue configuration, registers the JobSet and Kueue webhooks as
store admission hooks, seeds namespaces/flavors/queues, fills the informer
cache, and starts every controller's workers.  The returned `Controllers`
object is the hook for the API server:

* `Controllers.pending_workloads` - Kueue's visibility API
  (`pendingworkloads` of a ClusterQueue or LocalQueue);
* `Controllers.pod_log` / `Controllers.pod_log_lines` - container logs;
* `Controllers.stop` - stop all threads.

Design and behaviour: docs/architecture/simulator_controllers.md.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

from simulators.cluster.clock import SimClock
from simulators.cluster.controllers.config import SimConfig, load_config, seed
from simulators.cluster.controllers.job import JobController
from simulators.cluster.controllers.jobset import (
    JobSetController,
    default_jobset,
    validate_jobset_create,
    validate_jobset_update,
)
from simulators.cluster.controllers.kubelet import Kubelet, LogUnavailable
from simulators.cluster.controllers.kueue import (
    KueueJobReconciler,
    KueueScheduler,
    UnknownQueue,
    kueue_jobset_mutate,
    kueue_jobset_validate_update,
)
from simulators.cluster.controllers.runtime import (
    JOBSETS,
    LOCALQUEUES,
    WATCHED,
    Controller,
    ControllerContext,
    EventRecorder,
    ObjectCache,
    Obj,
)
from simulators.cluster.resources import ResourceType
from simulators.cluster.store import invalid

__all__ = ["Controllers", "LogUnavailable", "UnknownQueue", "start_controllers"]

log = logging.getLogger(__name__)


class Controllers:
    """Running simulated controllers (returned by `start_controllers`)."""

    def __init__(self, store: Any, clock: SimClock, config: SimConfig) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.cache = ObjectCache()
        self.ctx = ControllerContext(store, clock, self.cache, EventRecorder(store, clock), config)
        self.jobset = JobSetController(self.ctx)
        self.job = JobController(self.ctx)
        self.kubelet = Kubelet(self.ctx, config.nodes)
        self.kueue_jobs = KueueJobReconciler(self.ctx, config.kueue)
        self.scheduler = KueueScheduler(self.ctx, config.kueue)
        self._stopped = False

    @property
    def controllers(self) -> list[Controller]:
        return [self.jobset, self.job, self.kubelet, self.kueue_jobs]

    # --- wiring -------------------------------------------------------------------

    def _listener(self, event_type: str, rt: ResourceType, obj: Obj) -> None:
        if self._stopped or rt not in WATCHED:
            return
        self.cache.apply(event_type, rt.plural, obj)

    def _admission(self, op: str, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        """JobSet + Kueue webhooks (run by the store under its lock, before validation)."""
        if rt.plural != JOBSETS.plural:
            return
        errors: list[str] = []
        if op == "CREATE":
            kueue_jobset_mutate(obj, self.config.kueue,
                                lambda ns, name: self.cache.get(LOCALQUEUES.plural, ns, name) is not None)
            default_jobset(obj)
            errors = validate_jobset_create(obj, restart_job_gate=self.config.jobset_feature_gates.get("RestartJob", False))
        elif op == "UPDATE" and old is not None:
            # The JobSet mutating webhook runs on UPDATE too (jobset pkg/webhooks/jobset_webhook.go,
            # verbs create;update), so a patched object is defaulted before the immutability
            # check: re-applying the same manifest (which lacks the defaults) is a no-op.
            default_jobset(obj)
            ns = (obj.get("metadata") or {}).get("namespace") or ""
            errors = validate_jobset_update(obj, old) + kueue_jobset_validate_update(
                obj, old, self.cache.get(LOCALQUEUES.plural, ns, "default") is not None)
        if errors:
            raise invalid(rt, obj["metadata"].get("name") or "", [
                {"reason": "FieldValueInvalid", "message": e.split(": ", 1)[1], "field": e.split(": ", 1)[0]}
                for e in errors])

    def _start(self) -> None:
        self.store.add_listener(self._listener)
        self.store.add_admission_hook(self._admission, (JOBSETS.plural,))
        seed(self.store, self.config)
        for rt in WATCHED:
            items, _ = self.store.list(rt)
            for obj in items:
                self.cache.apply("ADDED", rt.plural, obj)
        for c in self.controllers:
            c.start()
        self.scheduler.start()

    def stop(self) -> None:
        """Stop every worker thread (the store and clock stay usable)."""
        self._stopped = True
        self.scheduler.stop()
        for c in self.controllers:
            c.stop()

    # --- hooks for the API server ---------------------------------------------------

    def pending_workloads(self, cluster_queue: str | None = None, namespace: str | None = None,
                          local_queue: str | None = None) -> list[dict[str, Any]]:
        """Kueue visibility API items, see `simulators.cluster.controllers.kueue.KueueScheduler.pending_workloads`.

        Raises `UnknownQueue` (-> 404) for a ClusterQueue/LocalQueue that does not exist.
        """
        return self.scheduler.pending_workloads(cluster_queue, namespace, local_queue)

    def pod_log_lines(self, namespace: str, name: str, container: str | None = None,
                      previous: bool = False) -> list[tuple[float, str, str]]:
        """(simulated epoch seconds, line, stream) triples; LookupError -> 404, LogUnavailable -> 400."""
        return self.kubelet.log_lines(namespace, name, container, previous)

    def pod_usage(self, namespace: str | None = None) -> list[Any]:
        """What the running pods use now (`simulators.cluster.controllers.kubelet.Kubelet.pod_usage`)."""
        return self.kubelet.pod_usage(namespace)

    def pod_log(self, namespace: str, name: str, container: str | None = None, previous: bool = False,
                timestamps: bool = False, tail_lines: int | None = None, since_seconds: float | None = None) -> str:
        """A container's log text as `GET .../pods/{name}/log` returns it."""
        lines = self.pod_log_lines(namespace, name, container, previous)
        if since_seconds is not None:
            cutoff = self.clock.now() - since_seconds
            lines = [ln for ln in lines if ln[0] >= cutoff]
        if tail_lines is not None:
            lines = lines[-tail_lines:] if tail_lines > 0 else []
        if timestamps:
            return "".join(f"{dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.%f000Z')} {text}\n"
                           for t, text, _ in lines)
        return "".join(f"{text}\n" for _, text, _ in lines)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until every work queue is drained (tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(c.queue.idle() for c in self.controllers):
                return True
            time.sleep(0.005)
        return False


def start_controllers(store: Any, clock: SimClock, config_path: str | Path | None = None) -> Controllers:
    """Seed the queue configuration and start every simulated controller."""
    ctrls = Controllers(store, clock, load_config(config_path))
    ctrls._start()
    return ctrls
