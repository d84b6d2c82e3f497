"""Controller runtime for the simulator: informer cache, work queues, events.

The simulated controllers (`simulators.cluster.controllers.jobset`, `.job`,
`.kubelet`, `.kueue`) behave like real Kubernetes controllers: they read from
a local cache fed by the store's change listener (an informer), put object
keys on a de-duplicating work queue, and reconcile each key on worker threads
by reading the current state and writing only the differences through the
`simulators.cluster.store.Store` methods (optimistic concurrency: a 409 on a stale
resourceVersion requeues the key).  A periodic resync re-enqueues every key as
a backstop for any missed event.

`ControllerContext` bundles what every controller needs (store, clock, cache,
event recorder, config); `Controller` is the base class with the worker loop.
Created by `simulators.cluster.controllers.start_controllers`.
"""

from __future__ import annotations

import builtins
import collections
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

from simulators.cluster.clock import SimClock, format_time
from simulators.cluster.resources import ResourceType, by_plural

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped
Handler = Callable[[str, Obj, "Obj | None"], None]

# Resource types the controllers use, resolved once.
NAMESPACES = by_plural("namespaces")
PODS = by_plural("pods")
EVENTS = by_plural("events")
JOBS = by_plural("jobs")
JOBSETS = by_plural("jobsets")
WORKLOADS = by_plural("workloads")
CLUSTERQUEUES = by_plural("clusterqueues")
LOCALQUEUES = by_plural("localqueues")
RESOURCEFLAVORS = by_plural("resourceflavors")

WATCHED = (PODS, JOBS, JOBSETS, WORKLOADS, CLUSTERQUEUES, LOCALQUEUES, RESOURCEFLAVORS, NAMESPACES)


# --- small object helpers ----------------------------------------------------


def api_code(exc: BaseException) -> int | None:
    """HTTP status code of a store `ApiError` (duck-typed; None for other errors)."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def key_of(obj: Obj) -> Key:
    md = obj.get("metadata") or {}
    return (md.get("namespace") or "", md.get("name") or "")


def meta(obj: Obj) -> dict[str, Any]:
    md: dict[str, Any] = obj.setdefault("metadata", {})
    return md


def rv_int(obj: Obj | None) -> int:
    if not obj:
        return -1
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or -1)
    except (TypeError, ValueError):
        return -1


def clone(value: Any) -> Any:
    """Deep copy of plain JSON data (much faster than copy.deepcopy)."""
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) for v in value]
    return value


def status_copy(obj: Obj) -> Obj:
    """A copy of `obj` for a status write: shared metadata/spec, a private deep copy of status."""
    return {**obj, "status": clone(obj.get("status") or {})}


def controller_owner_uid(obj: Obj) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            uid: str | None = ref.get("uid")
            return uid
    return None


def controller_owner_name(obj: Obj, kind: str) -> str | None:
    """Name of the object's controlling owner when that owner is a ``kind``."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == kind:
            name: str | None = ref.get("name")
            return name
    return None


def owner_reference(owner: Obj, rt: ResourceType, block: bool = True) -> dict[str, Any]:
    md = owner["metadata"]
    return {
        "apiVersion": rt.api_version,
        "kind": rt.kind,
        "name": md["name"],
        "uid": md["uid"],
        "controller": True,
        "blockOwnerDeletion": block,
    }


def is_deleting(obj: Obj | None) -> bool:
    return bool(obj and (obj.get("metadata") or {}).get("deletionTimestamp"))


def find_condition(obj_or_conds: Obj | list[dict[str, Any]] | None, ctype: str) -> dict[str, Any] | None:
    if obj_or_conds is None:
        return None
    conds = obj_or_conds if isinstance(obj_or_conds, list) else ((obj_or_conds.get("status") or {}).get("conditions") or [])
    for c in conds:
        if c.get("type") == ctype:
            return c
    return None


def condition_true(obj: Obj | None, ctype: str) -> bool:
    c = find_condition(obj, ctype)
    return bool(c and c.get("status") == "True")


def set_condition(
    conds: list[dict[str, Any]],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    now: float,
    *,
    observed_generation: int | None = None,
    append_false: bool = True,
    extra: dict[str, Any] | None = None,
) -> bool:
    """Set a metav1.Condition in place; returns whether anything changed.

    apimachinery semantics: `lastTransitionTime` moves only when `status`
    flips; reason/message/observedGeneration are overwritten in place.  With
    `append_false=False` a missing condition is only added when `status` is
    "True" (the JobSet controller's rule, reference 1.7).
    """
    for c in conds:
        if c.get("type") != ctype:
            continue
        changed = False
        if c.get("status") != status:
            c["status"] = status
            c["lastTransitionTime"] = format_time(now)
            changed = True
        for k, v in (("reason", reason), ("message", message)):
            if c.get(k) != v:
                c[k] = v
                changed = True
        if observed_generation is not None and c.get("observedGeneration") != observed_generation:
            c["observedGeneration"] = observed_generation
            changed = True
        for k, v in (extra or {}).items():
            if c.get(k) != v:
                c[k] = v
                changed = True
        return changed
    if status != "True" and not append_false:
        return False
    cond: dict[str, Any] = {"type": ctype, "status": status}
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    cond.update({"lastTransitionTime": format_time(now), "reason": reason, "message": message})
    cond.update(extra or {})
    conds.append(cond)
    return True


# --- informer cache ----------------------------------------------------------


class ObjectCache:
    """Latest known copy of every watched object, with an owner-UID index.

    Fed by the store listener (and by the results of our own writes). Events
    may arrive out of order from concurrent writer threads, so an incoming
    object replaces the cached one only when its resourceVersion is newer;
    deleted UIDs are remembered so a late MODIFIED cannot resurrect them.
    Cached objects are shared and must be treated as read-only: `clone` before
    changing one for a write.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._objs: dict[str, dict[Key, Obj]] = collections.defaultdict(dict)
        self._by_owner: dict[str, dict[str, set[Key]]] = collections.defaultdict(lambda: collections.defaultdict(set))
        self._deleted: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._handlers: dict[str, list[Handler]] = collections.defaultdict(list)

    def add_handler(self, plural: str, fn: Handler) -> None:
        self._handlers[plural].append(fn)

    def apply(self, event_type: str, plural: str, obj: Obj) -> bool:
        """Record a change; calls the handlers if it was news. Returns whether applied."""
        md = obj.get("metadata") or {}
        key = (md.get("namespace") or "", md.get("name") or "")
        uid = md.get("uid") or ""
        rv = rv_int(obj)
        with self._lock:
            objs = self._objs[plural]
            old = objs.get(key)
            if event_type == "DELETED":
                if uid in self._deleted:
                    return False
                self._deleted[uid] = rv
                if len(self._deleted) > 200_000:
                    self._deleted.popitem(last=False)
                if old is not None and (old.get("metadata") or {}).get("uid") == uid:
                    del objs[key]
                    self._unindex(plural, key, old)
                elif old is not None:
                    return False  # a newer object of the same name exists
            else:
                if uid in self._deleted:
                    return False
                if old is not None and rv_int(old) >= rv and (old.get("metadata") or {}).get("uid") == uid:
                    return False
                if old is not None:
                    self._unindex(plural, key, old)
                objs[key] = obj
                for ref in md.get("ownerReferences") or ():
                    if ref.get("uid"):
                        self._by_owner[plural][ref["uid"]].add(key)
            handlers = list(self._handlers.get(plural, ()))
        for fn in handlers:
            try:
                fn(event_type, obj, old)
            except Exception:
                log.exception("sim.cache.handler_failed", extra={"plural": plural})
        return True

    def _unindex(self, plural: str, key: Key, old: Obj) -> None:
        for ref in (old.get("metadata") or {}).get("ownerReferences") or ():
            keys = self._by_owner[plural].get(ref.get("uid") or "")
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_owner[plural][ref["uid"]]

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._objs[plural].get((namespace or "", name))

    def list(self, plural: str, namespace: str | None = None) -> builtins.list[Obj]:
        with self._lock:
            values = list(self._objs[plural].values())
        if namespace is None:
            return values
        return [o for o in values if (o.get("metadata") or {}).get("namespace") == namespace]

    def keys(self, plural: str) -> builtins.list[Key]:
        with self._lock:
            return list(self._objs[plural].keys())

    def owned(self, plural: str, owner_uid: str) -> builtins.list[Obj]:
        """Objects of `plural` with an ownerReference to `owner_uid`."""
        with self._lock:
            keys = list(self._by_owner[plural].get(owner_uid, ()))
            objs = self._objs[plural]
            return [objs[k] for k in keys if k in objs]

    def was_deleted(self, uid: str) -> bool:
        with self._lock:
            return uid in self._deleted


# --- work queue ----------------------------------------------------------------


class WorkQueue:
    """De-duplicating work queue with delayed adds (client-go semantics).

    A key is processed by at most one worker at a time; adding a key while it
    is being processed re-queues it once the worker calls `done`.
    """

    def __init__(self, clock: SimClock, name: str) -> None:
        self.clock = clock
        self.name = name
        self._cond = threading.Condition()
        self._queue: collections.deque[Hashable] = collections.deque()
        self._dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._failures: dict[Hashable, int] = {}
        self._timers: dict[Hashable, float] = {}  # key -> earliest pending add_after (sim time)
        self._shutdown = False

    def add(self, key: Hashable) -> None:
        with self._cond:
            if self._shutdown or key in self._dirty:
                return
            self._dirty.add(key)
            if key in self._processing:
                return
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: Hashable, sim_delay: float) -> None:
        """Add `key` after `sim_delay` simulated seconds (one pending timer per key: the earliest)."""
        if sim_delay <= 0:
            self.add(key)
            return
        when = self.clock.now() + sim_delay
        with self._cond:
            pending = self._timers.get(key)
            if pending is not None and pending <= when + 1e-6:
                return  # an earlier (or equal) wake-up is already scheduled
            self._timers[key] = when

        def fire() -> None:
            with self._cond:
                if self._timers.get(key) == when:
                    del self._timers[key]
            self.add(key)

        self.clock.call_at(when, fire)

    def add_rate_limited(self, key: Hashable) -> None:
        """Requeue after a per-key exponential backoff (5 ms .. 1 s wall time)."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        wall = min(1.0, 0.005 * (2 ** min(n, 10))) * (0.5 + random.random())
        self.add_after(key, wall * self.clock.speed)

    def failures(self, key: Hashable) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def forget(self, key: Hashable) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def get(self) -> Hashable | None:
        with self._cond:
            while not self._queue and not self._shutdown:
                self._cond.wait()
            if self._shutdown:
                return None
            key = self._queue.popleft()
            self._dirty.discard(key)
            self._processing.add(key)
            return key

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def idle(self) -> bool:
        with self._cond:
            return not self._queue and not self._processing


# --- events ----------------------------------------------------------------------


class EventRecorder:
    """Writes core/v1 Events about objects, aggregating repeats (count, lastTimestamp)."""

    def __init__(self, store: Any, clock: SimClock) -> None:
        self.store = store
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: collections.OrderedDict[tuple[Any, ...], tuple[str, int]] = collections.OrderedDict()
        self._seq = 0

    def event(
        self,
        obj: Obj,
        rt: ResourceType,
        etype: str,
        reason: str,
        message: str,
        component: str,
        host: str | None = None,
    ) -> None:
        md = obj.get("metadata") or {}
        ns = md.get("namespace") or "default"
        now = self.clock.now()
        ts = format_time(now)
        agg_key = (ns, md.get("uid"), etype, reason, message, component)
        with self._lock:
            prior = self._seen.get(agg_key)
            self._seq += 1
            seq = self._seq
        if prior is not None:
            name, count = prior
            try:
                self.store.patch(EVENTS, ns, name, "merge", {"count": count + 1, "lastTimestamp": ts})
                with self._lock:
                    self._seen[agg_key] = (name, count + 1)
                    self._seen.move_to_end(agg_key)
                return
            except Exception as exc:  # the event was deleted: start a new one
                if api_code(exc) != 404:
                    log.warning("sim.events.patch_failed", exc_info=True)
                    return
        name = f"{md.get('name')}.{int(now * 1e9) + seq:x}"
        source: dict[str, str] = {"component": component}
        if host:
            source["host"] = host
        involved: dict[str, Any] = {
            "apiVersion": rt.api_version,
            "kind": rt.kind,
            "name": md.get("name"),
            "namespace": md.get("namespace") or "",
            "uid": md.get("uid"),
            "resourceVersion": md.get("resourceVersion"),
        }
        if not md.get("namespace"):
            involved.pop("namespace")
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": etype,
            "count": 1,
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "source": source,
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": host or component,
        }
        try:
            self.store.create(EVENTS, ns, body)
        except Exception:
            log.warning("sim.events.create_failed", exc_info=True)
            return
        with self._lock:
            self._seen[agg_key] = (name, 1)
            if len(self._seen) > 50_000:
                self._seen.popitem(last=False)


# --- controller base ---------------------------------------------------------------


@dataclass
class ControllerContext:
    store: Any
    clock: SimClock
    cache: ObjectCache
    recorder: EventRecorder
    config: Any = None
    extras: dict[str, Any] = field(default_factory=dict)

    # Writes go through the store; the returned object is applied to the cache
    # at once so the next reconcile does not act on a stale copy.

    def create(self, rt: ResourceType, obj: Obj) -> Obj:
        out: Obj = self.store.create(rt, meta(obj).get("namespace") or None, obj)
        self.cache.apply("ADDED", rt.plural, out)
        return out

    def update(self, rt: ResourceType, obj: Obj, subresource: str | None = None) -> Obj:
        ns, name = key_of(obj)
        out: Obj = self.store.update(rt, ns or None, name, obj, subresource=subresource)
        self.cache.apply("MODIFIED", rt.plural, out)
        return out

    def update_status(self, rt: ResourceType, obj: Obj) -> Obj:
        return self.update(rt, obj, subresource="status")

    def patch(self, rt: ResourceType, namespace: str, name: str, body: Any, patch_type: str = "merge", subresource: str | None = None) -> Obj:
        out: Obj = self.store.patch(rt, namespace or None, name, patch_type, body, subresource=subresource)
        self.cache.apply("MODIFIED", rt.plural, out)
        return out

    def delete(self, rt: ResourceType, namespace: str, name: str, propagation: str = "Background",
               uid: str | None = None, grace_period_seconds: int | None = None) -> bool:
        """Delete (ignoring 404 and UID mismatches); returns whether the call succeeded."""
        try:
            out = self.store.delete(
                rt, namespace or None, name,
                preconditions={"uid": uid} if uid else None,
                propagation_policy=propagation,
                grace_period_seconds=grace_period_seconds,
            )
            if isinstance(out, dict) and out.get("metadata", {}).get("deletionTimestamp"):
                self.cache.apply("MODIFIED", rt.plural, out)
            return True
        except Exception as exc:
            if api_code(exc) in (404, 409):
                return False
            raise

    def event(self, obj: Obj, rt: ResourceType, etype: str, reason: str, message: str, component: str, host: str | None = None) -> None:
        self.recorder.event(obj, rt, etype, reason, message, component, host)


class Controller:
    """Base class: one work queue, N worker threads, periodic resync.

    Subclasses implement `reconcile(key)` returning an optional simulated
    delay after which the key should be looked at again, and `resync_keys()`.
    """

    name = "controller"
    workers = 1
    resync_wall_seconds = 30.0

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.clock = ctx.clock
        self.cache = ctx.cache
        self.queue = WorkQueue(ctx.clock, self.name)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.reconciles = 0
        self.errors = 0
        self._tl = threading.local()

    def update_own_status(self, rt: ResourceType, obj: Obj) -> Obj:
        """Status write of this controller's primary object.

        The store calls listeners synchronously in the writing thread, so the
        watch event of this very write is recognised (`is_own`) and not
        enqueued again: the reconcile that made it already saw everything.
        """
        self._tl.uid = (obj.get("metadata") or {}).get("uid")
        try:
            return self.ctx.update_status(rt, obj)
        finally:
            self._tl.uid = None

    def is_own(self, event: str, obj: Obj) -> bool:
        return event == "MODIFIED" and getattr(self._tl, "uid", None) == (obj.get("metadata") or {}).get("uid")

    # subclasses -------------------------------------------------------------
    def reconcile(self, key: Hashable) -> float | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def resync_keys(self) -> Iterable[Hashable]:
        return ()

    # lifecycle --------------------------------------------------------------
    def start(self) -> None:
        for key in self.resync_keys():
            self.queue.add(key)
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, name=f"sim-{self.name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._resync_loop, name=f"sim-{self.name}-resync", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.queue.shutdown()
        for t in self._threads:
            t.join(timeout=5)

    def _resync_loop(self) -> None:
        while not self._stop.wait(self.resync_wall_seconds):
            for key in self.resync_keys():
                self.queue.add(key)

    def _worker(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                self.reconciles += 1
                after = self.reconcile(key)
            except Exception as exc:
                code = api_code(exc)
                if code not in (404, 409):
                    self.errors += 1
                    # Full traceback on the first failure of a key, one line on retries.
                    if self.queue.failures(key) == 0:
                        log.exception("sim.%s.reconcile_failed key=%s", self.name, key)
                    else:
                        log.warning("sim.%s.reconcile_failed key=%s error=%r", self.name, key, exc)
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
                if after is not None:
                    self.queue.add_after(key, after)
            finally:
                self.queue.done(key)

    def run_once(self, key: Hashable) -> float | None:
        """Reconcile `key` synchronously (tests)."""
        return self.reconcile(key)


def wait_idle(controllers: Iterable[Controller], timeout: float = 5.0) -> bool:
    """Wait (wall time) until every queue is empty and no worker is busy."""
    deadline = time.monotonic() + timeout
    ctrls = list(controllers)
    while time.monotonic() < deadline:
        if all(c.queue.idle() for c in ctrls):
            return True
        time.sleep(0.005)
    return False
