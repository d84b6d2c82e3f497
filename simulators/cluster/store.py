"""The simulator's object store: every Kubernetes API semantic lives here.

`Store` plays etcd plus the generic apiserver registry: one lock, one global
resourceVersion counter, per-type event logs for watches, uid/generation/
finalizer/deletionTimestamp rules, delete preconditions, and the garbage
collector (ownerReferences with Background/Foreground/Orphan propagation).

Callers:
* the HTTP layer (`simulators.cluster.apiserver`) turns each request into one
  Store call and serialises the result or the `ApiError`;
* the simulated controllers (`simulators.cluster.controllers`) call
  create/get/list/update/patch/delete in-process, exactly as a real controller
  would call the API, and subscribe with `Store.add_listener` to enqueue
  reconciles;
* `simulators.cluster.server.run_simulator` wires both and persists
  `Store.snapshot` to the state file.

Contracts worth knowing (mirroring a real API server, upstream
kubernetes/kubernetes ``staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go``):
* Every returned object is a private deep copy; the stored objects are never
  mutated in place (a write builds a new dict), so watch history can share them.
* `create` drops `status` for types with a status subresource (pods start as
  ``{"phase": "Pending"}``, namespaces as ``{"phase": "Active"}``) and applies
  built-in defaulting (pods, batch Jobs: selector and controller-uid labels).
* `update`/`patch` without `subresource` ignore `status` for types with a
  status subresource; `subresource="status"` only changes `status`.
  `metadata.generation` is bumped when anything but metadata (and status, for
  types with a status subresource) changes.  No-op writes keep the RV.
* `delete` of an object with finalizers sets `deletionTimestamp`; the write
  that empties the finalizers removes it.  Pods on a node are deleted
  gracefully: `deletionTimestamp = now + grace` and they stay until someone
  deletes them again with grace 0 (the kubelet stand-in) or
  `Store.reap_graceful_deletions` runs after the deadline (the server calls
  it periodically).  batch/v1 Jobs default to the Orphan policy, as on a real
  cluster; pass ``propagation_policy="Background"`` to delete their pods.
* Admission: `Store.add_admission_hook` registers mutating/validating hooks
  (the JobSet and Kueue webhooks) that run under the store lock for
  main-resource CREATE and UPDATE (patches included); they may mutate the
  object or raise `ApiError`, they may read the store but must not write.
* Listeners (`Store.add_listener`) run after the commit, outside the lock, in
  the writing thread, with one read-only copy of the object per event.
"""

from __future__ import annotations

import base64
import bisect
import json
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from simulators.cluster import defaults
from simulators.cluster.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from simulators.cluster.resources import RESOURCE_TYPES, ResourceType, by_plural
from simulators.cluster.selectors import parse_field_selector, parse_label_selector

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
Listener = Callable[[str, ResourceType, Obj], None]
Events = list[tuple[str, ResourceType, Obj]]  # committed changes to hand to listeners
ObjList = list[Obj]
T = TypeVar("T")
AdmissionHook = Callable[[str, ResourceType, Obj, "Obj | None"], None]

PROPAGATION_POLICIES = ("Orphan", "Background", "Foreground")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CONTINUE_EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token in "
    "this response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list."
)


# ---------------------------------------------------------------------------
# Errors


class ApiError(Exception):
    """An API failure carrying a metav1.Status body (code, reason, message, details)."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def _resource_details(rt: ResourceType, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified_resource} "{name}" not found', _resource_details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{rt.qualified_resource} "{name}" already exists', _resource_details(rt, name)
    )


def conflict(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.qualified_resource} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        _resource_details(rt, name),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def invalid(rt: ResourceType, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid; causes are {"reason", "message", "field"} as in metav1.StatusCause."""
    texts = [f"{c['field']}: {c['message']}" for c in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: dict[str, Any] = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.kind
    details["causes"] = causes
    return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {joined}', details)


def json_patch_failed() -> ApiError:
    return ApiError(422, "Invalid", "the server rejected our request due to an error in our request", {})


def unsupported_media_type() -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
    )


# ---------------------------------------------------------------------------
# Small helpers


def clone(value: T) -> T:
    """Deep copy of plain JSON data (much faster than copy.deepcopy)."""
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list):
        return [clone(v) for v in value]  # type: ignore[return-value]
    return value


def format_time(ts: float) -> str:
    """RFC 3339 with second precision and `Z`, as metav1.Time serialises."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def parse_time(text: str) -> float:
    """Parse an RFC 3339 timestamp (`Z` or an offset, optional fraction)."""
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _rt(rt: ResourceType | str) -> ResourceType:
    return by_plural(rt) if isinstance(rt, str) else rt


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _normalise_metadata(meta: dict[str, Any]) -> None:
    """Drop empty collections, as Go's omitempty does on serialisation."""
    for key in ("finalizers", "labels", "annotations", "ownerReferences"):
        if key in meta and not meta[key]:
            del meta[key]


_UTC_OFFSET_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00$")


def _normalise_times(value: Any) -> Any:
    """Rewrite `...+00:00` timestamps as `...Z`, as metav1.Time serialises.

    The python client re-serialises datetimes with an offset; a real server
    parses and re-emits them in UTC with `Z`.  Annotations and labels are
    opaque strings and are left alone.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str):
                if v.endswith("+00:00") and _UTC_OFFSET_TIME.match(v):
                    value[k] = v[:-6] + "Z"
            elif k not in ("annotations", "labels") and isinstance(v, (dict, list)):
                _normalise_times(v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, str):
                if v.endswith("+00:00") and _UTC_OFFSET_TIME.match(v):
                    value[i] = v[:-6] + "Z"
            elif isinstance(v, (dict, list)):
                _normalise_times(v)
    return value


def _without(obj: Obj, *keys: str) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


# ---------------------------------------------------------------------------
# Watch history


@dataclass
class WatchEvent:
    """One committed change in a type's history.  `obj`/`prev` are shared, read-only."""

    rv: int
    type: str
    obj: Obj
    prev: Obj | None
    cache: dict[str, bytes] = field(default_factory=dict)  # serialised lines, filled by the HTTP layer


class _Log:
    """Per-type ordered event history plus the condition watchers wait on.

    Lock order: the store lock, then a log's condition lock.  Watchers only take
    the latter, so a slow watcher never blocks writers.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.events: list[WatchEvent] = []
        self.base = 0  # sequence number of events[0]
        self.compacted_rv = 0  # watching from an RV below this gets 410
        self.high_rv = 0  # every event of this type with rv <= high_rv is in `events`

    @property
    def next_seq(self) -> int:
        return self.base + len(self.events)

    def trim(self, keep: int) -> None:
        """Drop the oldest events beyond `keep` (caller holds cond)."""
        drop = len(self.events) - keep
        if drop > 0:
            self.compacted_rv = max(self.compacted_rv, self.events[drop - 1].rv)
            del self.events[:drop]
            self.base += drop


# ---------------------------------------------------------------------------
# The store


class Store:
    """Thread-safe in-memory Kubernetes object store with API-server semantics."""

    #: events kept per resource type for watch resumption (older RVs get 410);
    #: the real watch cache keeps far fewer, this only bounds memory
    history_limit: int = 5000
    #: seconds between BOOKMARK events on idle watches that asked for them
    bookmark_interval_s: float = 1.0
    #: seconds between idle ticks of `iter_watch_events` (lets the HTTP layer notice disconnects)
    idle_tick_s: float = 1.0

    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._lock = threading.RLock()
        self._rv = 0
        self._objects: dict[str, dict[Key, Obj]] = {p: {} for p in RESOURCE_TYPES}
        self._logs: dict[str, _Log] = {p: _Log() for p in RESOURCE_TYPES}
        self._by_uid: dict[str, tuple[str, Key]] = {}
        self._dependents: dict[str, set[tuple[str, Key]]] = {}
        self._ns_count: dict[str, int] = {}
        self._graceful: dict[Key, float] = {}  # pods awaiting graceful deletion -> deadline
        self._listeners: list[Listener] = []
        self._admission: list[tuple[frozenset[str] | None, AdmissionHook]] = []
        self._closed = False
        #: How many times each object was created, by (plural, namespace, name, xmc execution-id label):
        #: what the crash tests read to prove no JobSet was ever created twice.
        self.creates: dict[tuple[str, str, str, str], int] = {}
        self._compacted_rv = 0  # like an etcd compaction: continue tokens / Exact reads below it get 410
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create("namespaces", None, {"metadata": {"name": ns}})

    # -- registration --------------------------------------------------------

    def add_listener(self, fn: Listener) -> None:
        """Call `fn(event_type, rt, obj_copy)` after every committed change."""
        with self._lock:
            self._listeners.append(fn)

    def add_admission_hook(self, fn: AdmissionHook, plurals: tuple[str, ...] | None = None) -> None:
        """Register `fn(operation, rt, obj, old)` for CREATE/UPDATE of `plurals` (all if None)."""
        with self._lock:
            self._admission.append((frozenset(plurals) if plurals else None, fn))

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @property
    def resource_version(self) -> int:
        return self._rv

    def close(self) -> None:
        """End every watch stream (server shutdown)."""
        self._closed = True
        for log in self._logs.values():
            with log.cond:
                log.cond.notify_all()

    # -- public verbs ----------------------------------------------------------

    def create(self, rt: ResourceType | str, namespace: str | None, obj: Obj, dry_run: bool = False) -> Obj:
        rt = _rt(rt)
        events: Events = []
        with self._lock:
            out = self._create_locked(rt, namespace, obj, events, dry_run)
            if not dry_run:
                meta = out.get("metadata") or {}
                key = (rt.plural, namespace or "", str(meta.get("name", "")),
                       str((meta.get("labels") or {}).get("xmc.google.com/execution-id", "")))
                self.creates[key] = self.creates.get(key, 0) + 1
        self._dispatch(events)
        return clone(out)

    def get(self, rt: ResourceType | str, namespace: str | None, name: str) -> Obj:
        rt = _rt(rt)
        with self._lock:
            return clone(self._get_locked(rt, namespace, name))

    def list(
        self,
        rt: ResourceType | str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[ObjList, str]:
        items, rv, _, _ = self.list_page(rt, namespace, label_selector, field_selector)
        return items, rv

    def peek(self, rt: ResourceType | str) -> ObjList:
        """Every stored object of ``rt`` as stored, not copied: for readers that only read (the
        visibility view walks every Workload on each request; copying 10,000 of them was most of
        its time). The caller must not change them."""
        rt = _rt(rt)
        with self._lock:
            return list(self._objects[rt.plural].values())

    def list_page(
        self,
        rt: ResourceType | str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> tuple[ObjList, str, str | None, int | None]:
        """A list with paging: (items, list RV, continue token or None, remainingItemCount)."""
        rt = _rt(rt)
        label_match, field_match = self._selectors(rt, label_selector, field_selector)
        with self._lock:
            list_rv = self._rv
            start_after: str | None = None
            if continue_token:
                try:
                    token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                    token_rv, start_after = int(token["rv"]), str(token["start"])
                except Exception as exc:  # noqa: BLE001 - any garbage is a bad token
                    raise bad_request(f"invalid continue token: {exc}") from None
                if token_rv < self._compacted_rv:
                    raise expired(CONTINUE_EXPIRED_MESSAGE)
                list_rv = token_rv
            elif resource_version and resource_version_match == "Exact":
                wanted = self._parse_rv(resource_version)
                if wanted < self._compacted_rv:
                    raise expired(f"too old resource version: {wanted} ({self._compacted_rv + 1})")
            matched = [
                (key, obj)
                for key, obj in self._objects[rt.plural].items()
                if (not namespace or not rt.namespaced or key[0] == namespace)
                and self._matches(obj, label_match, field_match)
            ]
            matched.sort(key=lambda kv: kv[0])
            if start_after is not None:
                ns_s, _, name_s = start_after.partition("/")
                idx = bisect.bisect_right([k for k, _ in matched], (ns_s, name_s))
                matched = matched[idx:]
            cont: str | None = None
            remaining: int | None = None
            if limit and limit > 0 and len(matched) > limit:
                remaining = len(matched) - limit
                matched = matched[:limit]
                last = matched[-1][0]
                cont = base64.urlsafe_b64encode(
                    json.dumps({"rv": list_rv, "start": f"{last[0]}/{last[1]}"}).encode()
                ).decode()
            items = [clone(obj) for _, obj in matched]
        return items, str(list_rv), cont, remaining

    def update(
        self,
        rt: ResourceType | str,
        namespace: str | None,
        name: str,
        obj: Obj,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """PUT semantics (409 on a stale RV; CRDs require an RV)."""
        rt = _rt(rt)
        if not isinstance(obj, dict):
            raise bad_request("request body must be a JSON object")
        events: Events = []
        with self._lock:
            cur = self._get_locked(rt, namespace, name)
            rv_in = _meta(obj).get("resourceVersion")
            if rv_in:
                if str(rv_in) != cur["metadata"]["resourceVersion"]:
                    raise conflict(rt, name)
            elif rt.crd:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{rt.qualified_resource} "{name}" is invalid: metadata.resourceVersion: '
                    "Invalid value: 0x0: must be specified for an update",
                    {
                        "name": name,
                        **({"group": rt.group} if rt.group else {}),
                        "kind": rt.kind,
                        "causes": [
                            {
                                "reason": "FieldValueInvalid",
                                "message": "Invalid value: 0x0: must be specified for an update",
                                "field": "metadata.resourceVersion",
                            }
                        ],
                    },
                )
            out = self._apply_write_locked(rt, cur, obj, subresource, events, dry_run)
        self._dispatch(events)
        return clone(out)

    def patch(
        self,
        rt: ResourceType | str,
        namespace: str | None,
        name: str,
        patch_type: str,
        body: Any,
        subresource: str | None = None,
        dry_run: bool = False,
        convert: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None = None,
    ) -> Obj:
        """PATCH: patch_type "merge" | "json" | "strategic" | "apply" (or the full media types).

        `convert` = (to the client's version, back to storage): the patch is
        applied to the object as the client's API version shows it (the HTTP
        layer passes simulators.cluster.versions converters).

        "apply" (server-side apply) is approximated as create-if-absent, else
        merge patch.  A `metadata.resourceVersion` in the patched result that
        differs from the stored one is a 409 Conflict.
        """
        rt = _rt(rt)
        kind = _patch_kind(patch_type)
        if kind == "strategic" and not rt.strategic_merge:
            raise unsupported_media_type()
        if isinstance(body, (bytes, str)):
            try:
                body = json.loads(body) if body else None
            except ValueError as exc:
                if kind == "apply":
                    body = _load_yaml(body)
                else:
                    raise bad_request(f"error decoding patch: {exc}") from None
        events: Events = []
        with self._lock:
            if kind == "apply":
                key = self._key(rt, namespace, name)
                if key not in self._objects[rt.plural] and subresource is None:
                    if not isinstance(body, dict):
                        raise bad_request("apply patch must be an object")
                    body = convert[1](body) if convert else clone(body)
                    body.setdefault("metadata", {}).setdefault("name", name)
                    out = self._create_locked(rt, namespace, body, events, dry_run)
                    kind = ""
            if kind:
                cur = self._get_locked(rt, namespace, name)
                view = convert[0](cur) if convert else cur
                try:
                    if kind == "json":
                        patched = json_patch(view, body)
                    elif kind == "strategic":
                        if not isinstance(body, dict):
                            raise bad_request("strategic merge patch must be a JSON object")
                        patched = strategic_merge_patch(view, body)
                    else:
                        if not isinstance(body, dict):
                            raise bad_request("merge patch must be a JSON object")
                        patched = merge_patch(view, body)
                    if convert:
                        patched = convert[1](patched)
                except PatchError:
                    raise json_patch_failed() from None
                except ValueError as exc:
                    raise bad_request(str(exc)) from None
                if not isinstance(patched, dict):
                    raise bad_request("patch result is not an object")
                rv_after = _meta(patched).get("resourceVersion")
                if rv_after and str(rv_after) != cur["metadata"]["resourceVersion"]:
                    raise conflict(rt, name)
                out = self._apply_write_locked(rt, cur, patched, subresource, events, dry_run)
        self._dispatch(events)
        return clone(out)

    def delete(
        self,
        rt: ResourceType | str,
        namespace: str | None,
        name: str,
        preconditions: dict[str, Any] | None = None,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """DELETE: the updated object if it stays (finalizers, graceful), else the
        deleted object (pods, namespaces) or a Status Success."""
        rt = _rt(rt)
        events: Events = []
        with self._lock:
            out = self._delete_locked(
                rt, self._key(rt, namespace, name), preconditions, propagation_policy,
                grace_period_seconds, events, dry_run,
            )
        self._dispatch(events)
        return clone(out)

    def keep_terminating(self, namespace: str | None, name: str) -> None:
        """A pod whose node is gone: no kubelet will confirm its graceful deletion, so the
        reaper must not either; it stays Terminating until deleted with grace period 0."""
        with self._lock:
            self._graceful.pop(self._key(by_plural("pods"), namespace, name), None)

    def reap_graceful_deletions(self) -> int:
        """Remove pods whose graceful-deletion deadline has passed; returns how many."""
        now = self._clock()
        events: Events = []
        count = 0
        with self._lock:
            due = [key for key, deadline in self._graceful.items() if deadline <= now]
            for key in due:
                self._graceful.pop(key, None)
                if key in self._objects["pods"]:
                    self._delete_locked(by_plural("pods"), key, None, None, 0, events, False)
                    count += 1
        self._dispatch(events)
        return count

    def expire_events(self, ttl_s: float) -> int:
        """Delete core Events older than `ttl_s` (the apiserver's --event-ttl); returns how many."""
        cutoff = self._clock() - ttl_s
        events: Events = []
        count = 0
        rt = by_plural("events")
        with self._lock:
            for key, obj in list(self._objects["events"].items()):
                stamp = obj.get("lastTimestamp") or obj["metadata"].get("creationTimestamp")
                try:
                    expired_ = parse_time(stamp) < cutoff if stamp else False
                except ValueError:
                    expired_ = False
                if expired_:
                    self._delete_locked(rt, key, None, None, None, events, False)
                    count += 1
        self._dispatch(events)
        return count

    def compact(self, resource_version: int | None = None) -> None:
        """Forget history up to `resource_version` (default: now), like an etcd
        compaction: watches and continue tokens from older RVs get 410."""
        with self._lock:
            floor = self._rv if resource_version is None else resource_version
            self._compacted_rv = max(self._compacted_rv, floor)
            for log in self._logs.values():
                with log.cond:
                    keep = len([e for e in log.events if e.rv > floor])
                    log.trim(keep)
                    log.compacted_rv = max(log.compacted_rv, floor)

    # -- watch ---------------------------------------------------------------

    def watch(
        self,
        rt: ResourceType | str,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = False,
        timeout_s: float | None = None,
        send_initial_events: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Yield watch events {"type", "object"} (object is a private copy).

        A too-old `resource_version` yields one ERROR event (410 Expired) and ends,
        as the real watch cache does.  Ends after `timeout_s` or `close()`.
        """
        for item in self.iter_watch_events(
            rt, namespace, resource_version, label_selector, field_selector,
            allow_bookmarks, timeout_s, send_initial_events,
        ):
            if item is not None:
                yield {"type": item[0], "object": clone(item[1])}

    def iter_watch_events(
        self,
        rt: ResourceType | str,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = False,
        timeout_s: float | None = None,
        send_initial_events: bool = False,
    ) -> Iterator[tuple[str, Obj, WatchEvent | None] | None]:
        """The raw watch stream for the HTTP layer: (type, shared object, history
        event or None) tuples, plus None on idle ticks.  Objects are shared and
        must not be mutated.  Selector errors raise ApiError before the first item."""
        rt = _rt(rt)
        label_match, field_match = self._selectors(rt, label_selector, field_selector)
        if resource_version:
            self._parse_rv(resource_version)
        return self._watch_gen(rt, namespace, resource_version, label_match, field_match,
                               allow_bookmarks, timeout_s, send_initial_events)

    def _watch_gen(
        self,
        rt: ResourceType,
        namespace: str | None,
        resource_version: str | None,
        label_match: Any,
        field_match: Any,
        allow_bookmarks: bool,
        timeout_s: float | None,
        send_initial_events: bool,
    ) -> Iterator[tuple[str, Obj, WatchEvent | None] | None]:
        log = self._logs[rt.plural]
        ns_filter = namespace if rt.namespaced and namespace else None

        def visible(obj: Obj | None) -> bool:
            if obj is None:
                return False
            if ns_filter is not None and obj["metadata"].get("namespace") != ns_filter:
                return False
            return self._matches(obj, label_match, field_match)

        initial: ObjList = []
        with self._lock:
            with log.cond:
                if resource_version in (None, "", "0"):
                    initial = [o for o in self._objects[rt.plural].values() if visible(o)]
                    initial.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
                    seq = log.next_seq
                    start_rv = self._rv
                else:
                    wanted = self._parse_rv(resource_version or "0")
                    if wanted < log.compacted_rv:
                        yield ("ERROR", expired(
                            f"too old resource version: {wanted} ({log.compacted_rv + 1})"
                        ).status_body(), None)
                        return
                    seq = log.base + bisect.bisect_right(log.events, wanted, key=lambda e: e.rv)
                    start_rv = wanted
        for obj in initial:
            yield ("ADDED", obj, None)
        if send_initial_events and allow_bookmarks:
            yield ("BOOKMARK", self._bookmark(rt, start_rv, initial_end=True), None)

        clock = time.monotonic
        deadline = clock() + timeout_s if timeout_s else None
        last_sent = clock()
        while not self._closed:
            with log.cond:
                if seq < log.base:
                    batch = None
                else:
                    batch = log.events[seq - log.base:]
                    if not batch:
                        wait = self.idle_tick_s
                        if allow_bookmarks:
                            wait = min(wait, max(0.0, last_sent + self.bookmark_interval_s - clock()))
                        if deadline is not None:
                            wait = min(wait, max(0.0, deadline - clock()))
                        if wait > 0:
                            log.cond.wait(wait)
                        batch = log.events[seq - log.base:] if seq >= log.base else None
                    high_rv = log.high_rv
            if batch is None:
                yield ("ERROR", expired(
                    f"too old resource version: {start_rv} ({log.compacted_rv + 1})"
                ).status_body(), None)
                return
            seq += len(batch)
            for ev in batch:
                start_rv = ev.rv
                now_vis = visible(ev.obj)
                if ev.type == "MODIFIED":
                    was_vis = visible(ev.prev)
                    if now_vis and was_vis:
                        yield ("MODIFIED", ev.obj, ev)
                    elif now_vis:
                        yield ("ADDED", ev.obj, None)
                    elif was_vis:
                        yield ("DELETED", ev.obj, None)
                    else:
                        continue
                elif now_vis:
                    yield (ev.type, ev.obj, ev)
                else:
                    continue
                last_sent = clock()
            if deadline is not None and clock() >= deadline:
                return
            if not batch:
                if allow_bookmarks and clock() - last_sent >= self.bookmark_interval_s:
                    yield ("BOOKMARK", self._bookmark(rt, max(high_rv, start_rv)), None)
                    last_sent = clock()
                else:
                    yield None

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> Obj:
        meta: dict[str, Any] = {"resourceVersion": str(rv), "creationTimestamp": None}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

    # -- persistence -----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """All objects and the RV counter as plain JSON data."""
        with self._lock:
            return {
                "format": 1,
                "resourceVersion": self._rv,
                "objects": {p: [clone(o) for o in objs.values()] for p, objs in self._objects.items()},
            }

    def restore(self, data: dict[str, Any]) -> None:
        """Replace the whole state with a `snapshot()` (no watch events, no listeners).

        History starts empty, so watches from an RV before the restore get 410.
        """
        with self._lock:
            self._objects = {p: {} for p in RESOURCE_TYPES}
            self._by_uid.clear()
            self._dependents.clear()
            self._ns_count.clear()
            self._graceful.clear()
            self._rv = int(data.get("resourceVersion", 0))
            for plural, objs in (data.get("objects") or {}).items():
                if plural not in RESOURCE_TYPES:
                    logger.warning("sim.store.restore_unknown_type", extra={"plural": plural})
                    continue
                rt = by_plural(plural)
                for obj in objs:
                    key = self._key(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
                    self._put(rt, key, obj, None)
                    self._rv = max(self._rv, int(obj["metadata"].get("resourceVersion", 0)))
                    meta = obj["metadata"]
                    if plural == "pods" and meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds"):
                        self._graceful[key] = parse_time(meta["deletionTimestamp"])
            self._compacted_rv = self._rv
            for log in self._logs.values():
                with log.cond:
                    log.events.clear()
                    log.base = 0
                    log.compacted_rv = self._rv
                    log.high_rv = self._rv
                    log.cond.notify_all()

    # -- internals: lookup ---------------------------------------------------------

    @staticmethod
    def _key(rt: ResourceType, namespace: str | None, name: str) -> Key:
        return ((namespace or "") if rt.namespaced else "", name)

    def _get_locked(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._objects[rt.plural].get(self._key(rt, namespace, name))
        if obj is None:
            raise not_found(rt, name)
        return obj

    @staticmethod
    def _parse_rv(text: str) -> int:
        try:
            return int(text)
        except (TypeError, ValueError):
            raise bad_request(f'invalid resource version "{text}"') from None

    @staticmethod
    def _selectors(rt: ResourceType, label_selector: str | None, field_selector: str | None) -> tuple[Any, Any]:
        try:
            label_match = parse_label_selector(label_selector)
        except ValueError as exc:
            raise bad_request(f"unable to parse requirement: {exc}") from None
        try:
            field_match = parse_field_selector(field_selector, rt.field_selectors)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        return label_match, field_match

    @staticmethod
    def _matches(obj: Obj, label_match: Any, field_match: Any) -> bool:
        if label_match is not None and not label_match(obj["metadata"].get("labels") or {}):
            return False
        if field_match is not None and not field_match(obj):
            return False
        return True

    # -- internals: commit ---------------------------------------------------------

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(self, rt: ResourceType, etype: str, obj: Obj, prev: Obj | None,
              events: Events) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        log = self._logs[rt.plural]
        with log.cond:
            log.events.append(WatchEvent(rv, etype, obj, prev))
            if len(log.events) > self.history_limit * 5 // 4:
                log.trim(self.history_limit)
            log.high_rv = rv
            log.cond.notify_all()
        for other in self._logs.values():
            other.high_rv = rv  # no event of another type has this rv: safe bookmark point
        events.append((etype, rt, obj))

    def _put(self, rt: ResourceType, key: Key, obj: Obj, prev: Obj | None) -> None:
        """Store `obj` under `key` and maintain the uid/owner/namespace indexes."""
        if prev is not None:
            self._unindex_owners(rt, key, prev)
        else:
            if rt.namespaced:
                self._ns_count[key[0]] = self._ns_count.get(key[0], 0) + 1
        self._objects[rt.plural][key] = obj
        self._by_uid[obj["metadata"]["uid"]] = (rt.plural, key)
        for ref in obj["metadata"].get("ownerReferences") or ():
            if isinstance(ref, dict) and ref.get("uid"):
                self._dependents.setdefault(ref["uid"], set()).add((rt.plural, key))

    def _unindex_owners(self, rt: ResourceType, key: Key, obj: Obj) -> None:
        for ref in obj["metadata"].get("ownerReferences") or ():
            if isinstance(ref, dict) and ref.get("uid"):
                deps = self._dependents.get(ref["uid"])
                if deps is not None:
                    deps.discard((rt.plural, key))
                    if not deps:
                        del self._dependents[ref["uid"]]

    def _dispatch(self, events: Events) -> None:
        if not events or not self._listeners:
            return
        listeners = list(self._listeners)
        for etype, rt, obj in events:
            copy_ = clone(obj)
            for fn in listeners:
                try:
                    fn(etype, rt, copy_)
                except Exception:  # noqa: BLE001 - a broken listener must not break writes
                    logger.exception("sim.store.listener_failed")

    def _admit(self, op: str, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        for plurals, hook in self._admission:
            if plurals is None or rt.plural in plurals:
                hook(op, rt, obj, old)

    def _create_locked(self, rt: ResourceType, namespace: str | None, body: Any,
                       events: Events, dry_run: bool) -> Obj:
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object")
        obj: Obj = body
        obj = clone(obj)
        meta = obj.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        for server_owned in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "generation", "selfLink", "managedFields"):
            meta.pop(server_owned, None)
        if rt.namespaced:
            body_ns = meta.get("namespace")
            namespace = namespace or body_ns
            if not namespace:
                raise bad_request("an empty namespace may not be set during creation")
            if body_ns and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        name: str = meta.get("name") or ""
        if not name:
            prefix = meta.get("generateName")
            if not prefix:
                raise invalid(rt, "", [{
                    "reason": "FieldValueRequired",
                    "message": "Required value: name or generateName is required",
                    "field": "metadata.name",
                }])
            for _ in range(100):
                name = prefix + "".join(random.choice(_NAME_CHARS) for _ in range(5))
                if self._key(rt, namespace, name) not in self._objects[rt.plural]:
                    break
            meta["name"] = name
        key = self._key(rt, namespace, name)
        if rt.namespaced:
            ns_obj = self._objects["namespaces"].get(("", namespace or ""))
            if ns_obj is None:
                raise not_found(by_plural("namespaces"), namespace or "")
            if ns_obj["metadata"].get("deletionTimestamp"):
                raise ApiError(
                    403, "Forbidden",
                    f'{rt.qualified_resource} "{name}" is forbidden: unable to create new content in '
                    f"namespace {namespace} because it is being terminated",
                    _resource_details(rt, name),
                )
        if key in self._objects[rt.plural]:
            raise already_exists(rt, name)
        obj = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta,
               **_without(obj, "apiVersion", "kind", "metadata")}
        if rt.has_status_subresource:
            obj.pop("status", None)
        uid = str(uuid.uuid4())
        defaults.apply_create_defaults(rt, obj, uid)
        self._admit("CREATE", rt, obj, None)
        causes = defaults.validate(rt, obj)
        if causes:
            raise invalid(rt, name, causes)
        meta = obj["metadata"]
        meta["uid"] = uid
        meta["creationTimestamp"] = format_time(self._clock())
        if rt.has_generation:
            meta["generation"] = 1
        _normalise_metadata(meta)
        _normalise_times(obj)
        if dry_run:
            meta["resourceVersion"] = str(self._rv)
            return obj
        meta["resourceVersion"] = str(self._next_rv())
        self._put(rt, key, obj, None)
        self._emit(rt, "ADDED", obj, None, events)
        refs = [r for r in meta.get("ownerReferences") or () if isinstance(r, dict)]
        if refs and not any(r.get("uid") in self._by_uid for r in refs):
            # Garbage collector: every owner is already gone, so is the dependent.
            return self._delete_locked(rt, key, None, "Background", None, events, False)
        return obj

    def _apply_write_locked(self, rt: ResourceType, cur: Obj, incoming: Obj, subresource: str | None,
                            events: Events, dry_run: bool) -> Obj:
        """Turn a PUT body or patched object into the new stored object and commit it."""
        name = cur["metadata"]["name"]
        in_meta = incoming.get("metadata")
        if in_meta is not None and not isinstance(in_meta, dict):
            raise bad_request("metadata must be an object")
        in_meta = in_meta or {}
        if in_meta.get("name") and in_meta["name"] != name:
            raise bad_request(f"the name of the object ({in_meta['name']}) does not match the name on the URL ({name})")
        if rt.namespaced and in_meta.get("namespace") and in_meta["namespace"] != cur["metadata"].get("namespace"):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if subresource == "status":
            if not rt.has_status_subresource:
                raise not_found(rt, name)
            result = dict(cur)
            result["metadata"] = dict(cur["metadata"])
            if incoming.get("status") is not None:
                result["status"] = _normalise_times(clone(incoming["status"]))
            else:
                result.pop("status", None)
        elif subresource == "finalize" and rt.plural == "namespaces":
            result = dict(cur)
            result["metadata"] = dict(cur["metadata"])
            result["spec"] = dict(cur.get("spec") or {})
            result["spec"]["finalizers"] = clone((incoming.get("spec") or {}).get("finalizers") or [])
        elif subresource is None:
            result = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": clone(in_meta),
                      **clone(_without(incoming, "apiVersion", "kind", "metadata"))}
            meta = result["metadata"]
            for owned in ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "namespace", "name"):
                if owned in cur["metadata"]:
                    meta[owned] = cur["metadata"][owned]
                else:
                    meta.pop(owned, None)
            meta.pop("managedFields", None)
            meta.pop("selfLink", None)
            _normalise_times(result)  # only fresh copies so far: stored dicts are never mutated
            if rt.has_status_subresource:
                if "status" in cur:
                    result["status"] = cur["status"]
                else:
                    result.pop("status", None)
            if cur["metadata"].get("deletionTimestamp"):
                old_f = set(cur["metadata"].get("finalizers") or ())
                new_f = [f for f in meta.get("finalizers") or () if f not in old_f]
                if new_f:
                    raise invalid(rt, name, [{
                        "reason": "FieldValueForbidden",
                        "message": "Forbidden: no new finalizers can be added if the object is being deleted, "
                                   f"found new finalizers {json.dumps(new_f)}",
                        "field": "metadata.finalizers",
                    }])
            self._admit("UPDATE", rt, result, cur)
            causes = defaults.validate(rt, result)
            if causes:
                raise invalid(rt, name, causes)
            if rt.has_generation:
                skip = ("metadata", "status") if rt.has_status_subresource else ("metadata",)
                if _without(result, *skip) != _without(cur, *skip):
                    meta["generation"] = int(cur["metadata"].get("generation", 1)) + 1
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        result["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        _normalise_metadata(result["metadata"])
        return self._commit_update_locked(rt, cur, result, events, dry_run)

    def _commit_update_locked(self, rt: ResourceType, cur: Obj, result: Obj,
                              events: Events, dry_run: bool) -> Obj:
        if result == cur:
            return cur  # no-op: no new RV, no event
        if dry_run:
            return result
        meta = result["metadata"]
        key = self._key(rt, meta.get("namespace"), meta["name"])
        meta["resourceVersion"] = str(self._next_rv())
        if (meta.get("deletionTimestamp") and not meta.get("finalizers")
                and not meta.get("deletionGracePeriodSeconds")):
            self._remove_locked(rt, key, result, cur, events)
            return result
        self._put(rt, key, result, cur)
        self._emit(rt, "MODIFIED", result, cur, events)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and rt.plural == "namespaces":
            self._maybe_finalize_namespace(meta["name"], events)
        return result

    def _remove_locked(self, rt: ResourceType, key: Key, final: Obj, prev: Obj,
                       events: Events) -> None:
        """Remove the object (final state already carries its new RV) and run the GC."""
        del self._objects[rt.plural][key]
        self._unindex_owners(rt, key, prev)
        uid = final["metadata"]["uid"]
        self._by_uid.pop(uid, None)
        if rt.plural == "pods":
            self._graceful.pop(key, None)
        if rt.namespaced:
            self._ns_count[key[0]] = self._ns_count.get(key[0], 1) - 1
        self._emit(rt, "DELETED", final, prev, events)
        # Garbage collector, part 1: dependents of the removed owner.
        for dep_plural, dep_key in sorted(self._dependents.pop(uid, set())):
            dep_rt = by_plural(dep_plural)
            dep = self._objects[dep_plural].get(dep_key)
            if dep is None:
                continue
            refs = dep["metadata"].get("ownerReferences") or []
            others = [r for r in refs if r.get("uid") != uid]
            if any(r.get("uid") in self._by_uid for r in others):
                updated = dict(dep)
                updated["metadata"] = dict(dep["metadata"], ownerReferences=others)
                _normalise_metadata(updated["metadata"])
                self._commit_update_locked(dep_rt, dep, updated, events, False)
            elif not dep["metadata"].get("deletionTimestamp"):
                self._delete_locked(dep_rt, dep_key, None, "Background", None, events, False)
        # Garbage collector, part 2: owners waiting in foreground deletion.
        for ref in prev["metadata"].get("ownerReferences") or ():
            self._maybe_finish_foreground(ref.get("uid"), events)
        if rt.namespaced:
            self._maybe_finalize_namespace(key[0], events)

    def _maybe_finish_foreground(self, owner_uid: str | None, events: Events) -> None:
        located = self._by_uid.get(owner_uid or "")
        if located is None:
            return
        plural, key = located
        owner = self._objects[plural][key]
        meta = owner["metadata"]
        if not meta.get("deletionTimestamp") or "foregroundDeletion" not in (meta.get("finalizers") or ()):
            return
        for dep_plural, dep_key in self._dependents.get(owner_uid or "", ()):
            dep = self._objects[dep_plural].get(dep_key)
            if dep is None:
                continue
            for ref in dep["metadata"].get("ownerReferences") or ():
                if ref.get("uid") == owner_uid and ref.get("blockOwnerDeletion"):
                    return  # still blocked
        updated = dict(owner)
        updated["metadata"] = dict(meta, finalizers=[f for f in meta["finalizers"] if f != "foregroundDeletion"])
        _normalise_metadata(updated["metadata"])
        self._commit_update_locked(by_plural(plural), owner, updated, events, False)

    def _maybe_finalize_namespace(self, namespace: str, events: Events) -> None:
        ns_obj = self._objects["namespaces"].get(("", namespace))
        if ns_obj is None or not ns_obj["metadata"].get("deletionTimestamp"):
            return
        if self._ns_count.get(namespace, 0) > 0 or ns_obj["metadata"].get("finalizers"):
            return
        final = dict(ns_obj)
        final["metadata"] = dict(ns_obj["metadata"], resourceVersion=str(self._next_rv()))
        final["spec"] = dict(ns_obj.get("spec") or {}, finalizers=[])
        self._remove_locked(by_plural("namespaces"), ("", namespace), final, ns_obj, events)

    def _delete_locked(self, rt: ResourceType, key: Key, preconditions: dict[str, Any] | None,
                       propagation_policy: str | None, grace_period_seconds: int | None,
                       events: Events, dry_run: bool) -> Obj:
        cur = self._objects[rt.plural].get(key)
        name = key[1]
        if cur is None:
            raise not_found(rt, name)
        meta = cur["metadata"]
        if preconditions:
            details = {"name": name, **({"group": rt.group} if rt.group else {}), "kind": rt.kind}
            want_uid = preconditions.get("uid")
            if want_uid and want_uid != meta["uid"]:
                raise ApiError(
                    409, "Conflict",
                    f'Operation cannot be fulfilled on {rt.qualified_kind} "{name}": the UID in the '
                    f"precondition ({want_uid}) does not match the UID in record ({meta['uid']}). "
                    "The object might have been deleted and then recreated",
                    details,
                )
            want_rv = preconditions.get("resourceVersion")
            if want_rv and str(want_rv) != meta["resourceVersion"]:
                raise ApiError(
                    409, "Conflict",
                    f'Operation cannot be fulfilled on {rt.qualified_kind} "{name}": the ResourceVersion '
                    f"in the precondition ({want_rv}) does not match the ResourceVersion in record "
                    f"({meta['resourceVersion']}). The object might have been modified",
                    details,
                )
        policy = propagation_policy or rt.default_propagation
        if policy not in PROPAGATION_POLICIES:
            raise invalid(rt, name, [{
                "reason": "FieldValueNotSupported",
                "message": f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"',
                "field": "propagationPolicy",
            }])
        now = self._clock()
        if rt.plural == "namespaces":
            return self._delete_namespace_locked(cur, events, dry_run)

        grace = 0
        if rt.plural == "pods":
            spec = cur.get("spec") or {}
            phase = (cur.get("status") or {}).get("phase")
            if grace_period_seconds is not None:
                grace = max(0, int(grace_period_seconds))
            else:
                grace = int(spec.get("terminationGracePeriodSeconds", 30) or 0)
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
                grace = 0

        if meta.get("deletionTimestamp"):
            # Already being deleted: only a shorter grace period changes anything.
            pending = meta.get("deletionGracePeriodSeconds") or 0
            if rt.plural != "pods" or grace >= pending or dry_run:
                return cur
            updated = dict(cur)
            updated["metadata"] = dict(meta, deletionGracePeriodSeconds=grace,
                                       deletionTimestamp=format_time(now + grace))
            if grace > 0:
                self._graceful[key] = now + grace
            else:
                self._graceful.pop(key, None)
            return self._deleted_response(rt, self._commit_update_locked(rt, cur, updated, events, False), key)

        if dry_run:
            return cur
        if policy == "Orphan":
            self._orphan_dependents(meta["uid"], events)
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and self._dependents.get(meta["uid"]) and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")

        if finalizers or grace > 0:
            updated = dict(cur)
            updated["metadata"] = dict(meta, deletionTimestamp=format_time(now + grace),
                                       deletionGracePeriodSeconds=grace)
            if finalizers:
                updated["metadata"]["finalizers"] = finalizers
            if rt.has_generation and grace == 0:
                updated["metadata"]["generation"] = int(meta.get("generation", 1)) + 1
            if grace > 0:
                self._graceful[key] = now + grace
            out = self._commit_update_locked(rt, cur, updated, events, False)
            if policy == "Foreground":
                for dep_plural, dep_key in sorted(self._dependents.get(meta["uid"], set())):
                    dep = self._objects[dep_plural].get(dep_key)
                    if dep is not None and not dep["metadata"].get("deletionTimestamp"):
                        self._delete_locked(by_plural(dep_plural), dep_key, None, "Foreground", None, events, False)
                self._maybe_finish_foreground(meta["uid"], events)
            current = self._objects[rt.plural].get(key)
            return current if current is not None else self._deleted_response(rt, out, key)

        final = dict(cur)
        final["metadata"] = dict(meta, resourceVersion=str(self._next_rv()))
        self._remove_locked(rt, key, final, cur, events)
        return self._deleted_response(rt, final, key)

    def _deleted_response(self, rt: ResourceType, obj: Obj, key: Key) -> Obj:
        if key in self._objects[rt.plural] or rt.return_deleted_object:
            return obj
        details: dict[str, Any] = {"name": key[1]}
        if rt.group:
            details["group"] = rt.group
        details["kind"] = rt.plural
        details["uid"] = obj["metadata"]["uid"]
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def _orphan_dependents(self, uid: str, events: Events) -> None:
        for dep_plural, dep_key in sorted(self._dependents.get(uid, set())):
            dep = self._objects[dep_plural].get(dep_key)
            if dep is None:
                continue
            updated = dict(dep)
            refs = [r for r in dep["metadata"].get("ownerReferences") or () if r.get("uid") != uid]
            updated["metadata"] = dict(dep["metadata"], ownerReferences=refs)
            _normalise_metadata(updated["metadata"])
            self._commit_update_locked(by_plural(dep_plural), dep, updated, events, False)

    def _delete_namespace_locked(self, cur: Obj, events: Events, dry_run: bool) -> Obj:
        ns_rt = by_plural("namespaces")
        name = cur["metadata"]["name"]
        if cur["metadata"].get("deletionTimestamp") or dry_run:
            return cur
        updated = dict(cur)
        updated["metadata"] = dict(cur["metadata"], deletionTimestamp=format_time(self._clock()),
                                   deletionGracePeriodSeconds=0)
        updated["status"] = dict(cur.get("status") or {}, phase="Terminating")
        self._commit_update_locked(ns_rt, cur, updated, events, False)
        # The namespace controller: delete every namespaced object in it.
        for rt in RESOURCE_TYPES.values():
            if not rt.namespaced:
                continue
            for key in sorted(k for k in self._objects[rt.plural] if k[0] == name):
                obj = self._objects[rt.plural].get(key)
                if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                    self._delete_locked(rt, key, None, "Background", 0, events, False)
        self._maybe_finalize_namespace(name, events)
        return self._objects["namespaces"].get(("", name)) or updated


def _patch_kind(patch_type: str) -> str:
    pt = patch_type.split(";")[0].strip().lower()
    return {
        "merge": "merge",
        "application/merge-patch+json": "merge",
        "json": "json",
        "application/json-patch+json": "json",
        "strategic": "strategic",
        "application/strategic-merge-patch+json": "strategic",
        "apply": "apply",
        "application/apply-patch+yaml": "apply",
        "application/apply-patch+json": "apply",
    }.get(pt) or _raise_unsupported()


def _raise_unsupported() -> str:
    raise unsupported_media_type()


def _load_yaml(body: bytes | str) -> Any:
    import yaml

    try:
        return yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise bad_request(f"error decoding YAML: {exc}") from None
