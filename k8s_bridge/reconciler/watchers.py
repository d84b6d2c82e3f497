"""List-then-watch of one kind in one namespace, keeping the latest object per key.

An :class:`Informer` lists (remembering the list's resourceVersion), then
watches from that resourceVersion, asking for BOOKMARK events so an idle
watch still advances it. When a watch ends (server timeout) it resumes from
the last resourceVersion seen; when the server answers 410 Gone (the
resourceVersion was compacted) it lists again. A relist also synthesizes
DELETED for objects that disappeared while nobody watched. Every
``resync_s`` the informer lists again even without errors (the periodic full
resync the orphan sweep rides on).

The cache holds only the latest object per ``(namespace, name)``; the
controller is told *which* key changed and reads the cache, so it always
works from the current object, never from a queue of stale events
(level-triggered). Every Kubernetes call goes through ``k8s_bridge.client``.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from k8s_bridge import client
from k8s_bridge.reconciler import metrics

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]
#: on_change(kind, event type, object): called for every change the cache takes.
OnChange = Callable[[str, str, Obj], None]
#: on_list(kind, namespace, items): called after every (re)list with the full list.
OnList = Callable[[str, str, list[Obj]], None]


@dataclass(frozen=True)
class Kind:
    """How to list and watch one resource kind."""

    name: str
    group: str = ""
    version: str = "v1"
    plural: str = ""
    label_selector: str = ""
    #: further versions to try when the server does not serve ``version`` (404)
    fallback_versions: tuple[str, ...] = ()


def key_of(obj: Mapping[str, Any]) -> Key:
    md = obj.get("metadata") or {}
    return (str(md.get("namespace") or ""), str(md.get("name") or ""))


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class Informer:
    def __init__(
        self,
        kind: Kind,
        namespace: str,
        on_change: OnChange,
        *,
        on_list: OnList | None = None,
        resync_s: float = 300.0,
        watch_timeout_s: int = 30,
    ) -> None:
        self.kind = kind
        self.namespace = namespace
        self.on_change = on_change
        self.on_list = on_list
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.cache: dict[Key, Obj] = {}
        self.resource_version = ""
        self.version = kind.version
        self.synced = threading.Event()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._resync_now = threading.Event()
        self._thread: threading.Thread | None = None

    # --- API calls ---------------------------------------------------------------------

    def _list_call(self, **kwargs: Any) -> Any:
        if self.kind.group:
            return client.custom_objects().list_namespaced_custom_object(
                self.kind.group, self.version, self.namespace, self.kind.plural, **kwargs
            )
        return client.core().list_namespaced_pod(self.namespace, **kwargs)

    def _list(self) -> tuple[list[Obj], str]:
        kwargs: dict[str, Any] = {"_preload_content": False, "_request_timeout": 60}
        if self.kind.label_selector:
            kwargs["label_selector"] = self.kind.label_selector
        versions = (self.version, *[v for v in self.kind.fallback_versions if v != self.version])
        for i, version in enumerate(versions):
            self.version = version
            try:
                response = self._list_call(**kwargs)
            except client.ApiException as exc:
                if exc.status == 404 and i + 1 < len(versions):
                    continue
                raise
            body = json.loads(response.data)
            return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")
        raise AssertionError("unreachable")  # pragma: no cover

    # --- cache ------------------------------------------------------------------------

    def relist(self, reason: str) -> list[Obj]:
        """List now, replace the cache, report changes; returns the listed objects."""
        items, rv = self._list()
        metrics.RELISTS.labels(self.kind.name, reason).inc()
        changes: list[tuple[str, Obj]] = []
        with self._lock:
            fresh = {key_of(o): o for o in items}
            for key, gone in self.cache.items():
                if key not in fresh:
                    changes.append(("DELETED", gone))
            for key, obj in fresh.items():
                cached = self.cache.get(key)
                if cached is None or _rv(cached) != _rv(obj):
                    changes.append(("ADDED" if cached is None else "MODIFIED", obj))
            self.cache = fresh
            self.resource_version = rv
        for kind, obj in changes:
            self.on_change(self.kind.name, kind, obj)
        if self.on_list is not None:
            self.on_list(self.kind.name, self.namespace, items)
        self.synced.set()
        return items

    def _apply(self, event_type: str, obj: Obj) -> None:
        metrics.EVENTS.labels(self.kind.name, event_type).inc()
        rv = _rv(obj)
        with self._lock:
            if rv:
                self.resource_version = rv
            if event_type == "BOOKMARK":
                return
            key = key_of(obj)
            if _older(obj, self.cache.get(key)):
                return  # a concurrent relist already stored something newer
            if event_type == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = obj
        self.on_change(self.kind.name, event_type, obj)

    def get(self, key: Key) -> Obj | None:
        with self._lock:
            return self.cache.get(key)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self.cache.values())

    # --- the loop ------------------------------------------------------------------------

    def _watch(self, until: float) -> None:
        timeout = max(1, min(self.watch_timeout_s, int(until - time.monotonic()) + 1))
        kwargs: dict[str, Any] = {
            "resource_version": self.resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout,
            "_request_timeout": timeout + 15,
        }
        if self.kind.label_selector:
            kwargs["label_selector"] = self.kind.label_selector
        watcher = client.watch()
        if self.kind.group:
            stream = watcher.stream(
                client.custom_objects().list_namespaced_custom_object,
                self.kind.group, self.version, self.namespace, self.kind.plural, **kwargs,
            )
        else:
            stream = watcher.stream(client.core().list_namespaced_pod, self.namespace, **kwargs)
        try:
            for event in stream:
                if self._stop.is_set() or self._resync_now.is_set():
                    watcher.stop()
                    break
                raw = event.get("raw_object") or {}
                self._apply(str(event.get("type")), raw)
        except client.ApiException as exc:
            if exc.status == 410:
                raise Gone(str(exc)) from None
            raise

    def run(self) -> None:
        backoff = 0.5
        need_list = "start"
        next_resync = 0.0
        while not self._stop.is_set():
            try:
                if need_list:
                    self.relist(need_list)
                    next_resync = time.monotonic() + self.resync_s
                    need_list = ""
                self._watch(next_resync)
                backoff = 0.5
                if self._resync_now.is_set() or time.monotonic() >= next_resync:
                    self._resync_now.clear()
                    need_list = "resync"
            except Gone:
                log.info("reconciler.watch_gone", extra={"kind": self.kind.name, "namespace": self.namespace})
                need_list = "gone"
            except Exception:
                if self._stop.is_set():
                    break
                log.exception("reconciler.watch_failed", extra={"kind": self.kind.name, "namespace": self.namespace})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                need_list = need_list or "error"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run, name=f"informer-{self.kind.name}-{self.namespace}", daemon=True
        )
        self._thread.start()

    def request_resync(self) -> None:
        self._resync_now.set()

    def stop(self) -> None:
        self._stop.set()


def _older(obj: Mapping[str, Any], cached: Mapping[str, Any] | None) -> bool:
    """Whether ``obj`` predates ``cached`` (resourceVersions compared only when both are integers)."""
    if cached is None:
        return False
    new, old = _rv(obj), _rv(cached)
    return (new.isascii() and new.isdigit()) and (old.isascii() and old.isdigit()) and int(new) < int(old)


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
