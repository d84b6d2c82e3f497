"""HTTP layer of the simulated Kubernetes API server.

A thin translation from HTTP requests to `simulators.cluster.store.Store` calls
and back: URL routing, discovery (legacy and aggregated), a minimal OpenAPI v3
so `kubectl create/apply -f` validate server-side, Table output for
`kubectl get`, chunked watch streams, pod logs and the Kueue visibility API.
No API semantics live here (resourceVersion, generation, finalizers, GC and
selectors are the store's); this module only parses, calls and serialises.

Used by `simulators.cluster.server.run_simulator` (which `python -m simulators.cluster`
and the tests call).  Clients: the official `kubernetes` Python client, real
`kubectl` and kopf, all unauthenticated over plain HTTP.

Plug-in points for the simulated controllers (they never import the HTTP
layer otherwise):

* ``register_visibility_provider(fn, store=None)`` — the Kueue controller
  supplies the pending-workload view served at
  ``/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/{cq}/pendingworkloads``
  and ``.../namespaces/{ns}/localqueues/{lq}/pendingworkloads``.
  ``fn(queue_kind, namespace, name) -> list[dict]`` where queue_kind is
  ``"clusterqueues"`` (namespace None) or ``"localqueues"``, returning every
  pending Workload of that queue as PendingWorkload dicts, in queue order,
  with ``positionInClusterQueue``/``positionInLocalQueue`` filled in; raise
  `simulators.cluster.store.ApiError` (404) for an unknown queue.  The server
  applies ``offset``/``limit``.  Without a provider, the server computes the
  view from the stored Workloads (`default_pending_workloads`).
* ``register_log_provider(fn, store=None)`` — the kubelet stand-in supplies
  container logs: ``fn(namespace, pod_name, container, previous)`` returning
  ``[(sim_time, line), ...]``, ``[(sim_time, line, stream), ...]`` (stream
  ``stdout`` / ``stderr``) or a string; raise LookupError for a missing pod
  (404) and any other exception for "no logs" (400 with its message).
  Without a provider, logs come from `pod_log_buffer(store)`, which tests can
  append to.

* ``register_usage_provider(fn, store=None)`` — the kubelet stand-in supplies
  what the running pods use: ``fn(namespace_or_None)`` returning
  `simulators.cluster.controllers.usage.PodUsage` items, served as
  ``metrics.k8s.io/v1beta1`` PodMetrics (metrics-server's API) and as the
  Prometheus text of NVIDIA's DCGM exporter (``/metrics/dcgm``) and of cAdvisor
  (``/metrics/cadvisor``), rendered by `simulators.cluster.podmetrics`.
  Without a provider every list is empty.

With ``store=None`` the registration is process-wide (the default for every
store); with a store it applies to that simulator only.
"""

from __future__ import annotations

import heapq
import json
import logging
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from simulators.cluster import podlogs, podmetrics, tables
from simulators.cluster.faults import ERROR_REASONS, Decision, Faults, classify_request
from simulators.cluster.resources import RESOURCE_TYPES, ResourceType, by_group_version_plural, group_versions
from simulators.cluster.selectors import parse_label_selector
from simulators.cluster.store import ApiError, Store, bad_request, format_time, not_found
from simulators.cluster.versions import from_version, to_version

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
VisibilityProvider = Callable[[str, "str | None", str], list[Obj]]
LogProvider = Callable[[str, str, "str | None", bool], Any]

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-xmc-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSION = "v1beta1"
# Kueue serves the visibility API in v1beta2 (preferred since v0.15) and v1beta1.
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_AGG_CT = "application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList"
_NOT_FOUND = ApiError(404, "NotFound", "the server could not find the requested resource")

# ---------------------------------------------------------------------------
# Provider registries


_GLOBAL_PROVIDERS: dict[str, Any] = {}
_STORE_PROVIDERS: dict[int, dict[str, Any]] = {}
_PROVIDERS_LOCK = threading.Lock()


def register_visibility_provider(fn: VisibilityProvider | None, store: Store | None = None) -> None:
    """Serve the Kueue visibility API from `fn` (see the module docstring)."""
    _register("visibility", fn, store)


def register_usage_provider(fn: podmetrics.UsageProvider | None, store: Store | None = None) -> None:
    """Serve PodMetrics and the DCGM / cAdvisor text from `fn` (see the module docstring)."""
    _register("usage", fn, store)


def register_log_provider(fn: LogProvider | None, store: Store | None = None) -> None:
    """Serve pods/log from `fn` (see the module docstring)."""
    _register("logs", fn, store)


def _register(kind: str, fn: Any, store: Store | None) -> None:
    with _PROVIDERS_LOCK:
        target = _GLOBAL_PROVIDERS if store is None else _STORE_PROVIDERS.setdefault(id(store), {})
        if fn is None:
            target.pop(kind, None)
        else:
            target[kind] = fn


def _provider(kind: str, store: Store) -> Any:
    with _PROVIDERS_LOCK:
        return _STORE_PROVIDERS.get(id(store), {}).get(kind) or _GLOBAL_PROVIDERS.get(kind)


def forget_store(store: Store) -> None:
    """Drop per-store registrations (called when a simulator stops)."""
    with _PROVIDERS_LOCK:
        _STORE_PROVIDERS.pop(id(store), None)


class PodLogBuffer:
    """Fallback container logs: lines appended by tests or tools, per container."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[tuple[str, str, str], list[tuple[float, str]]] = {}

    def append(self, namespace: str, pod: str, container: str, text: str, at: float | None = None) -> None:
        with self._lock:
            bucket = self._lines.setdefault((namespace, pod, container), [])
            for line in text.splitlines():
                bucket.append((time.time() if at is None else at, line))

    def lines(self, namespace: str, pod: str, container: str) -> list[tuple[float, str]]:
        with self._lock:
            return list(self._lines.get((namespace, pod, container), []))


_LOG_BUFFERS: dict[int, PodLogBuffer] = {}


def pod_log_buffer(store: Store) -> PodLogBuffer:
    with _PROVIDERS_LOCK:
        return _LOG_BUFFERS.setdefault(id(store), PodLogBuffer())


def default_pending_workloads(store: Store, queue_kind: str, namespace: str | None, name: str,
                              offset: int = 0, limit: int | None = None) -> list[Obj]:
    """Pending Workloads of a queue computed from stored objects (no Kueue controller): items
    ``offset`` to ``offset + limit`` (all when ``limit`` is None), as the visibility API pages them.

    Pending = no quota reserved, not finished, active.  Order: priority desc,
    creationTimestamp, uid — Kueue's default queue order.  Every workload is filtered and
    ordered up to the page's end (as upstream orders its queue's copy on each request, here a
    partial sort), and only the page's items are built: the positions in a LocalQueue are
    counted up to the page's end.
    """
    if queue_kind == "clusterqueues":
        store.get("clusterqueues", None, name)
    else:
        store.get("localqueues", namespace, name)
    lq_to_cq = {
        (lq["metadata"]["namespace"], lq["metadata"]["name"]): (lq.get("spec") or {}).get("clusterQueue")
        for lq in store.list("localqueues")[0]
    }
    pending: list[tuple[int, str, str, Obj]] = []
    for wl in store.peek("workloads"):  # read only: not copied
        spec = wl.get("spec") or {}
        if spec.get("active") is False:
            continue
        status = wl.get("status")
        if status and (status.get("admission") or any(
                c.get("status") == "True" and c.get("type") in ("QuotaReserved", "Finished")
                for c in status.get("conditions") or ())):
            continue
        md = wl["metadata"]
        ns, queue = md["namespace"], spec.get("queueName") or ""
        if queue_kind == "clusterqueues":
            if lq_to_cq.get((ns, queue)) != name:
                continue
        elif ns != namespace or queue != name:
            continue
        pending.append((-int(spec.get("priority") or 0), md.get("creationTimestamp") or "", md["uid"], wl))
    stop = len(pending) if limit is None else min(len(pending), offset + max(0, limit))
    # Only the first `stop` in order: a partial sort (the uid is unique, so no two keys tie).
    pending = heapq.nsmallest(stop, pending, key=lambda entry: entry[:3])
    per_lq: dict[tuple[str, str], int] = {}
    items = []
    for pos in range(stop):
        wl = pending[pos][3]
        md = wl["metadata"]
        lq_key = (md["namespace"], (wl.get("spec") or {}).get("queueName") or "")
        lq_pos = per_lq.get(lq_key, 0)
        per_lq[lq_key] = lq_pos + 1
        if pos < offset:
            continue
        items.append({
            "metadata": {
                "name": md["name"], "namespace": md["namespace"],
                "creationTimestamp": md.get("creationTimestamp"),
                **({"ownerReferences": md["ownerReferences"]} if md.get("ownerReferences") else {}),
            },
            "priority": -pending[pos][0],
            "localQueueName": lq_key[1],
            "positionInClusterQueue": pos,
            "positionInLocalQueue": lq_pos,
        })
    return items


# ---------------------------------------------------------------------------
# Request / response


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: bytes = b""

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("true", "1")

    def int_param(self, name: str) -> int | None:
        value = self.query.get(name)
        if value in (None, ""):
            return None
        try:
            return int(value)  # type: ignore[arg-type]
        except ValueError:
            raise bad_request(f"invalid value for {name}: {value!r}") from None

    @property
    def wants_table(self) -> bool:
        accept = self.headers.get("accept", "")
        return "as=Table" in accept and "meta.k8s.io" in accept

    def json_body(self) -> Any:
        if not self.body:
            return None
        ctype = self.headers.get("content-type", "")
        try:
            if "yaml" in ctype:
                import yaml

                return yaml.safe_load(self.body)
            return json.loads(self.body)
        except ValueError as exc:
            raise bad_request(f"couldn't decode the request body: {exc}") from None


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    stream: Iterator[bytes | None] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Close the connection without sending this response (fault injection: a dropped connection).
    drop: bool = False


def _json(obj: Any, status: int = 200, content_type: str = "application/json") -> Response:
    return Response(status, json.dumps(obj, separators=(",", ":")).encode(), content_type)


def _error(err: ApiError) -> Response:
    return _json(err.status_body(), err.code)


# ---------------------------------------------------------------------------
# The API


class Api:
    """Routes one `Request` to the store and renders the `Response`."""

    def __init__(self, store: Store, server_address: str = "127.0.0.1:0"):
        self.store = store
        self.server_address = server_address
        #: Injected faults (simulators.cluster.faults); none by default.
        self.faults = Faults()

    # -- entry point ---------------------------------------------------------

    def handle(self, req: Request) -> Response:
        if req.path.rstrip("/") == "/sim/faults":
            return self._faults_endpoint(req)
        if req.path.rstrip("/") == "/sim/creates" and req.method == "GET":
            # How often each object was created (simulators.cluster.store.Store.creates), for crash tests.
            return _json([{"resource": k[0], "namespace": k[1], "name": k[2], "eid": k[3], "count": n}
                          for k, n in sorted(self.store.creates.items())])
        decision: Decision | None = None
        if self.faults.rules:
            verb, resource = classify_request(req.method, req.path, req.query)
            decision = self.faults.decide(verb, resource) if verb else None
        if decision is not None:
            early = self._fault_before(req, decision)
            if early is not None:
                return early
        try:
            resp = self._route(req)
        except ApiError as err:
            resp = _error(err)
        except Exception as exc:  # noqa: BLE001 - an emulator bug must still answer with a Status
            logger.exception("sim.apiserver.internal_error")
            resp = _error(ApiError(500, "InternalError", f"Internal error occurred: {exc!r}"))
        if decision is not None:
            if decision.watch_close_after is not None and resp.stream is not None:
                resp.stream = _cut_after(resp.stream, decision.watch_close_after)
            resp.drop = decision.drop_after
        return resp

    # -- fault injection ---------------------------------------------------------

    def _fault_before(self, req: Request, decision: Decision) -> Response | None:
        if decision.latency_s:
            time.sleep(decision.latency_s)
        if decision.drop:
            return Response(0, drop=True)
        rule = decision.error
        if rule is not None:
            reason = ERROR_REASONS[rule.status]
            resp = _error(ApiError(rule.status, reason, f"injected fault: {reason}"))
            if rule.status == 429:
                resp.headers["Retry-After"] = str(rule.retry_after)
            return resp
        if decision.gone and req.query.get("resourceVersion") not in (None, "", "0"):
            status = ApiError(410, "Expired", "injected fault: too old resource version").status_body()
            line = json.dumps({"type": "ERROR", "object": status}, separators=(",", ":")).encode() + b"\n"
            return Response(200, stream=iter([line]))
        return None

    def _faults_endpoint(self, req: Request) -> Response:
        try:
            if req.method == "GET":
                return _json(self.faults.snapshot())
            if req.method == "POST":
                self.faults.set(req.json_body())
                return _json(self.faults.snapshot())
            if req.method == "DELETE":
                self.faults.clear()
                return _json(self.faults.snapshot())
        except (TypeError, ValueError) as exc:
            return _error(bad_request(f"invalid fault: {exc}"))
        return _error(ApiError(405, "MethodNotAllowed", "GET, POST or DELETE /sim/faults"))

    def _route(self, req: Request) -> Response:
        parts = [p for p in req.path.split("/") if p]
        if not parts:
            return _json({"paths": ["/api", "/api/v1", "/apis", "/openapi/v2", "/openapi/v3", "/version"]})
        head = parts[0]
        if head == "version":
            return _json(VERSION_INFO)
        if head in ("healthz", "livez", "readyz"):
            return Response(200, b"ok", "text/plain")
        if head == "openapi":
            return self._openapi(req, parts[1:])
        if head == "metrics" and len(parts) == 2 and parts[1] in ("dcgm", "cadvisor"):
            render = podmetrics.dcgm_text if parts[1] == "dcgm" else podmetrics.cadvisor_text
            return Response(200, render(self._usage(None)).encode(), podmetrics.TEXT_CONTENT_TYPE)
        if head == "api":
            if len(parts) == 1:
                return self._discovery_core(req)
            group, version, rest = "", parts[1], parts[2:]
        elif head == "apis":
            if len(parts) == 1:
                return self._discovery_groups(req)
            if len(parts) == 2:
                return self._discovery_group(parts[1])
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise _NOT_FOUND
        if group == VISIBILITY_GROUP and version in VISIBILITY_VERSIONS:
            return self._visibility(req, rest, version)
        if group == podmetrics.GROUP and version == podmetrics.VERSION:
            return self._pod_metrics(req, rest)
        if not rest:
            return self._discovery_resources(group, version)
        return self._resource(req, group, version, rest)

    # -- resources -------------------------------------------------------------

    def _resource(self, req: Request, group: str, version: str, rest: list[str]) -> Response:
        namespace: str | None = None
        if (len(rest) >= 3 and rest[0] == "namespaces"
                and by_group_version_plural(group, version, rest[2]) is not None):
            namespace, rest = rest[1], rest[2:]
        rt = by_group_version_plural(group, version, rest[0])
        if rt is None or len(rest) > 3:
            raise _NOT_FOUND
        # Another served version than the storage one: convert in and out (simulators.cluster.versions).
        served: ResourceType = rt

        def out_v(obj: Any) -> Any:
            return to_version(served, obj, version)

        def in_v(obj: Any) -> Any:
            return from_version(served, obj, version)

        if namespace is not None and not rt.namespaced:
            raise _NOT_FOUND
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if name is not None and rt.namespaced and namespace is None:
            raise _NOT_FOUND
        if sub is not None and sub not in rt.subresources:
            raise _NOT_FOUND
        m = req.method
        if name is None:
            if m == "GET":
                if req.flag("watch"):
                    return self._watch(req, rt, namespace, version)
                return self._list(req, rt, namespace, version)
            if m == "POST":
                return self._create(req, rt, namespace, version)
            if m == "DELETE":
                return self._delete_collection(req, rt, namespace, version)
        elif sub == "log":
            if m == "GET":
                return self._pod_log(req, namespace or "", name)
        else:
            if m == "GET":
                obj = self.store.get(rt, namespace, name)
                if req.wants_table and sub is None:
                    return _json(tables.to_table(rt, [obj], self.store.clock(), obj["metadata"]["resourceVersion"],
                                                 include_object=req.query.get("includeObject", "Metadata")))
                return _json(out_v(obj))
            if m == "PUT":
                body = req.json_body()
                if not isinstance(body, dict):
                    raise bad_request("the body of the request must be an object")
                return _json(out_v(self.store.update(rt, namespace, name, in_v(body), subresource=sub,
                                                     dry_run=self._dry_run(req))))
            if m == "PATCH" and sub != "finalize":
                ctype = req.headers.get("content-type", "")
                if not ctype:
                    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
                convert = (out_v, in_v) if version != rt.version else None
                out = self.store.patch(rt, namespace, name, ctype, req.body, subresource=sub,
                                       dry_run=self._dry_run(req), convert=convert)
                return _json(out_v(out))
            if m == "DELETE" and sub is None:
                return _json(out_v(self._delete(req, rt, namespace, name)))
        return _error(ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource"))

    @staticmethod
    def _dry_run(req: Request) -> bool:
        return req.query.get("dryRun") == "All"

    def _list(self, req: Request, rt: ResourceType, namespace: str | None, version: str | None = None) -> Response:
        version = version or rt.version
        items, rv, cont, remaining = self.store.list_page(
            rt, namespace,
            label_selector=req.query.get("labelSelector"),
            field_selector=req.query.get("fieldSelector"),
            limit=req.int_param("limit"),
            continue_token=req.query.get("continue") or None,
            resource_version=req.query.get("resourceVersion"),
            resource_version_match=req.query.get("resourceVersionMatch"),
        )
        if req.wants_table:
            return _json(tables.to_table(rt, items, self.store.clock(), rv, cont,
                                         include_object=req.query.get("includeObject", "Metadata"),
                                         remaining=remaining))
        meta: Obj = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
        if remaining is not None:
            meta["remainingItemCount"] = remaining
        if version != rt.version:
            items = [to_version(rt, o, version) for o in items]
        return _json({"apiVersion": f"{rt.group}/{version}" if rt.group else version, "kind": rt.list_kind,
                      "metadata": meta, "items": items})

    def _create(self, req: Request, rt: ResourceType, namespace: str | None, version: str | None = None) -> Response:
        version = version or rt.version
        body = req.json_body()
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be an object")
        out = self.store.create(rt, namespace, from_version(rt, body, version), dry_run=self._dry_run(req))
        return _json(to_version(rt, out, version), 201)

    def _delete_options(self, req: Request) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if req.query.get("gracePeriodSeconds"):
            opts["gracePeriodSeconds"] = req.int_param("gracePeriodSeconds")
        if req.query.get("propagationPolicy"):
            opts["propagationPolicy"] = req.query["propagationPolicy"]
        if req.query.get("orphanDependents"):
            opts["orphanDependents"] = req.flag("orphanDependents")
        if req.query.get("dryRun"):
            opts["dryRun"] = [req.query["dryRun"]]
        body = req.json_body()
        if isinstance(body, dict):
            opts.update({k: v for k, v in body.items() if v is not None})
        return opts

    def _delete(self, req: Request, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        opts = self._delete_options(req)
        policy = opts.get("propagationPolicy")
        if policy is None and "orphanDependents" in opts:
            policy = "Orphan" if opts["orphanDependents"] else "Background"
        return self.store.delete(
            rt, namespace, name,
            preconditions=opts.get("preconditions") or None,
            propagation_policy=policy,
            grace_period_seconds=opts.get("gracePeriodSeconds"),
            dry_run="All" in (opts.get("dryRun") or []),
        )

    def _delete_collection(self, req: Request, rt: ResourceType, namespace: str | None,
                           version: str | None = None) -> Response:
        version = version or rt.version
        items, rv = self.store.list(rt, namespace, req.query.get("labelSelector"), req.query.get("fieldSelector"))
        deleted = []
        for obj in items:
            try:
                out = self._delete(req, rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
            except ApiError as err:
                if err.code == 404:
                    continue
                raise
            deleted.append(to_version(rt, out if out.get("kind") != "Status" else obj, version))
        return _json({"apiVersion": f"{rt.group}/{version}" if rt.group else version, "kind": rt.list_kind,
                      "metadata": {"resourceVersion": str(self.store.resource_version)}, "items": deleted})

    # -- watch -----------------------------------------------------------------------

    def _watch(self, req: Request, rt: ResourceType, namespace: str | None, version: str | None = None) -> Response:
        timeout = req.int_param("timeoutSeconds")
        events = self.store.iter_watch_events(
            rt, namespace,
            resource_version=req.query.get("resourceVersion"),
            label_selector=req.query.get("labelSelector"),
            field_selector=req.query.get("fieldSelector"),
            allow_bookmarks=req.flag("allowWatchBookmarks"),
            timeout_s=float(timeout) if timeout else 1800.0,
            send_initial_events=req.flag("sendInitialEvents"),
        )
        if version and version != rt.version:
            events = self._converted_events(rt, version, events)
        if req.wants_table:
            stream = self._table_lines(rt, None, events, req.query.get("includeObject", "Metadata"))
        else:
            stream = self._json_lines(None, events)
        return Response(200, stream=stream)

    @staticmethod
    def _converted_events(rt: ResourceType, version: str, events: Iterator[Any]) -> Iterator[Any]:
        """Watch items as `version` shows them (no shared cached line: the object differs)."""
        for item in events:
            if item is None:
                yield None
                continue
            etype, obj, _ = item
            yield etype, to_version(rt, obj, version), None

    @staticmethod
    def _json_lines(first: Any, events: Iterator[Any]) -> Iterator[bytes | None]:
        def gen() -> Iterator[bytes | None]:
            item = first
            it = events
            while True:
                if item is None:
                    yield None
                else:
                    etype, obj, ev = item
                    line = ev.cache.get(etype) if ev is not None else None
                    if line is None:
                        line = json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"
                        if ev is not None:
                            ev.cache[etype] = line
                    yield line
                try:
                    item = next(it)
                except StopIteration:
                    return

        return gen()

    def _table_lines(self, rt: ResourceType, first: Any, events: Iterator[Any], include: str) -> Iterator[bytes | None]:
        def gen() -> Iterator[bytes | None]:
            headers_sent = False
            item = first
            while True:
                if item is None:
                    yield None
                else:
                    etype, obj, _ = item
                    if etype in ("ADDED", "MODIFIED", "DELETED"):
                        obj = tables.to_table(rt, [obj], self.store.clock(), obj["metadata"]["resourceVersion"],
                                              include_headers=not headers_sent, include_object=include)
                        headers_sent = True
                    yield json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"
                try:
                    item = next(events)
                except StopIteration:
                    return

        return gen()

    # -- pods/log --------------------------------------------------------------------

    def _pod_log(self, req: Request, namespace: str, name: str) -> Response:
        """pods/{name}/log: options, filters and follow are `simulators.cluster.podlogs`'s."""
        pod = self.store.get("pods", namespace, name)
        container = req.query.get("container") or None
        spec = pod.get("spec") or {}
        names = [c.get("name") for c in spec.get("containers") or []]
        all_names = names + [c.get("name") for c in spec.get("initContainers") or []]
        if container is None:
            if len(names) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
                )
            container = names[0]
        if container not in all_names:
            raise bad_request(f'container "{container}" is not valid for pod "{name}"')
        opts = podlogs.parse_options(req.query, name, str(container), self.store.clock())

        def fetch(previous: bool) -> list[podlogs.Line]:
            return self._log_lines(self.store.get("pods", namespace, name), namespace, name, str(container), previous)

        if not opts.follow:
            return Response(200, podlogs.body(opts, fetch), "text/plain")
        # Errors (404, "waiting to start") are answered before the stream opens.
        first = fetch(opts.previous)
        served = iter([first])

        def fetch_once_then_live(previous: bool) -> list[podlogs.Line]:
            return next(served, None) or fetch(previous)

        stream = podlogs.follow(opts, fetch_once_then_live, lambda: self.store.get("pods", namespace, name))
        return Response(200, content_type="text/plain", stream=stream)

    def _log_lines(self, pod: Obj, namespace: str, name: str, container: str, previous: bool) -> list[podlogs.Line]:
        provider = _provider("logs", self.store)
        if provider is not None:
            try:
                result = provider(namespace, name, container, previous)
            except LookupError:
                raise not_found(RESOURCE_TYPES["pods"], name) from None
            except ApiError:
                raise
            except Exception as exc:  # noqa: BLE001 - the kubelet's "no logs yet" errors
                raise bad_request(str(exc)) from None
            return podlogs.normalise(result)
        status = next((cs for cs in (pod.get("status") or {}).get("containerStatuses") or []
                       if cs.get("name") == container), None)
        waiting = ((status or {}).get("state") or {}).get("waiting")
        lines = pod_log_buffer(self.store).lines(namespace, name, container)
        if not lines and (status is None or waiting):
            reason = (waiting or {}).get("reason") or "ContainerCreating"
            why = {"ImagePullBackOff": "trying and failing to pull image",
                   "ErrImagePull": "image can't be pulled"}.get(reason, reason)
            raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: {why}')
        return podlogs.normalise(lines)

    # -- Kueue visibility --------------------------------------------------------------

    def _visibility(self, req: Request, rest: list[str], version: str = VISIBILITY_VERSION) -> Response:
        if not rest:
            return self._discovery_resources(VISIBILITY_GROUP, version)
        if req.method != "GET":
            return _error(ApiError(405, "MethodNotAllowed",
                                   "the server does not allow this method on the requested resource"))
        if len(rest) == 3 and rest[0] == "clusterqueues" and rest[2] == "pendingworkloads":
            kind, namespace, name = "clusterqueues", None, rest[1]
        elif len(rest) == 5 and rest[0] == "namespaces" and rest[2] == "localqueues" and rest[4] == "pendingworkloads":
            kind, namespace, name = "localqueues", rest[1], rest[3]
        else:
            raise _NOT_FOUND
        offset = req.int_param("offset") or 0
        limit = req.int_param("limit")
        limit = 1000 if limit is None else limit
        provider = _provider("visibility", self.store)
        if provider is not None:
            items = provider(kind, namespace, name)[offset:offset + limit]
        else:  # only the page is built
            items = default_pending_workloads(self.store, kind, namespace, name, max(0, offset), limit)
        return _json({
            "kind": "PendingWorkloadsSummary",
            "apiVersion": f"{VISIBILITY_GROUP}/{version}",
            "metadata": {"creationTimestamp": None},
            "items": items,
        })

    # -- metrics-server (metrics.k8s.io) ---------------------------------------------

    def _usage(self, namespace: str | None) -> list[Any]:
        provider = _provider("usage", self.store)
        return list(provider(namespace)) if provider is not None else []

    def _pod_metrics(self, req: Request, rest: list[str]) -> Response:
        if not rest:
            return self._discovery_resources(podmetrics.GROUP, podmetrics.VERSION)
        if req.method != "GET":
            return _error(ApiError(405, "MethodNotAllowed",
                                   "the server does not allow this method on the requested resource"))
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if rest[0] != "pods" or len(rest) > 2:
            raise _NOT_FOUND
        name = rest[1] if len(rest) == 2 else None
        selector = parse_label_selector(req.query.get("labelSelector"))
        items = [podmetrics.pod_metrics(usage) for usage in self._usage(namespace)
                 if (name is None or usage.name == name) and (selector is None or selector(dict(usage.labels)))]
        if name is not None:
            if not items:
                raise ApiError(404, "NotFound", f'podmetrics.{podmetrics.GROUP} "{name}" not found',
                               {"name": name, "group": podmetrics.GROUP, "kind": "pods"})
            return _json(items[0])
        return _json(podmetrics.pod_metrics_list(sorted(items, key=lambda i: (i["metadata"]["namespace"],
                                                                              i["metadata"]["name"]))))

    @staticmethod
    def _pod_metrics_resources() -> list[Obj]:
        return [{"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics", "verbs": ["get", "list"]}]

    # -- discovery -----------------------------------------------------------------------

    @staticmethod
    def _wants_aggregated(req: Request) -> str | None:
        accept = req.headers.get("accept", "")
        if "as=APIGroupDiscoveryList" not in accept or "apidiscovery.k8s.io" not in accept:
            return None
        for part in accept.split(","):
            if "as=APIGroupDiscoveryList" in part:
                if "v=v2;" in part + ";" or part.rstrip().endswith("v=v2"):
                    return "v2"
        return "v2beta1"

    def _discovery_core(self, req: Request) -> Response:
        agg = self._wants_aggregated(req)
        if agg:
            return self._aggregated(agg, core=True)
        return _json({"kind": "APIVersions", "versions": ["v1"],
                      "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                      "serverAddress": self.server_address}]})

    @staticmethod
    def _groups() -> list[tuple[str, list[str]]]:
        groups: dict[str, list[str]] = {}
        for rt in RESOURCE_TYPES.values():
            if rt.group:
                versions = groups.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        for rt in RESOURCE_TYPES.values():
            for v in rt.other_versions:
                if rt.group and v not in groups[rt.group]:
                    groups[rt.group].append(v)
        groups[VISIBILITY_GROUP] = list(VISIBILITY_VERSIONS)
        groups[podmetrics.GROUP] = [podmetrics.VERSION]
        return list(groups.items())

    def _discovery_groups(self, req: Request) -> Response:
        agg = self._wants_aggregated(req)
        if agg:
            return self._aggregated(agg, core=False)
        return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            self._group_body(group, versions) for group, versions in self._groups()
        ]})

    @staticmethod
    def _group_body(group: str, versions: list[str]) -> Obj:
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def _discovery_group(self, group: str) -> Response:
        for name, versions in self._groups():
            if name == group:
                return _json({"kind": "APIGroup", "apiVersion": "v1", **self._group_body(group, versions)})
        raise _NOT_FOUND

    @staticmethod
    def _visibility_resources() -> list[Obj]:
        out = []
        for plural, kind, namespaced in (("clusterqueues", "ClusterQueue", False), ("localqueues", "LocalQueue", True)):
            out.append({"name": plural, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                        "verbs": ["get"]})
            out.append({"name": f"{plural}/pendingworkloads", "singularName": "", "namespaced": namespaced,
                        "kind": "PendingWorkloadsSummary", "verbs": ["get"]})
        return out

    def _discovery_resources(self, group: str, version: str) -> Response:
        gv = f"{group}/{version}" if group else version
        if group == VISIBILITY_GROUP and version in VISIBILITY_VERSIONS:
            resources = self._visibility_resources()
        elif group == podmetrics.GROUP and version == podmetrics.VERSION:
            resources = self._pod_metrics_resources()
        else:
            rts = group_versions().get(gv)
            if not rts:
                raise _NOT_FOUND
            resources = []
            for rt in rts:
                entry: Obj = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                              "kind": rt.kind, "verbs": list(_VERBS)}
                if rt.short_names:
                    entry["shortNames"] = list(rt.short_names)
                if rt.categories:
                    entry["categories"] = list(rt.categories)
                resources.append(entry)
                for sub in rt.subresources:
                    verbs = {"status": ["get", "patch", "update"], "log": ["get"], "finalize": ["update"]}[sub]
                    resources.append({"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                                      "kind": rt.kind, "verbs": verbs})
        return _json({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})

    def _aggregated(self, agg_version: str, core: bool) -> Response:
        items = []
        if core:
            items.append(self._agg_group("", ["v1"]))
        else:
            for group, versions in self._groups():
                items.append(self._agg_group(group, versions))
        body = {"kind": "APIGroupDiscoveryList", "apiVersion": f"apidiscovery.k8s.io/{agg_version}",
                "metadata": {}, "items": items}
        return _json(body, content_type=_AGG_CT.format(v=agg_version))

    def _agg_group(self, group: str, versions: list[str]) -> Obj:
        out_versions = []
        for version in versions:
            resources: list[Obj] = []
            if group == podmetrics.GROUP:
                resources.append({"resource": "pods", "responseKind": {"group": group, "version": version,
                                                                       "kind": "PodMetrics"},
                                  "scope": "Namespaced", "singularResource": "", "verbs": ["get", "list"]})
            elif group == VISIBILITY_GROUP:
                for plural, kind, namespaced in (("clusterqueues", "ClusterQueue", False),
                                                 ("localqueues", "LocalQueue", True)):
                    resources.append({
                        "resource": plural,
                        "responseKind": {"group": group, "version": version, "kind": kind},
                        "scope": "Namespaced" if namespaced else "Cluster",
                        "singularResource": kind.lower(),
                        "verbs": ["get"],
                        "subresources": [{"subresource": "pendingworkloads", "verbs": ["get"],
                                          "responseKind": {"group": group, "version": version,
                                                           "kind": "PendingWorkloadsSummary"}}],
                    })
            else:
                for rt in group_versions().get(f"{group}/{version}" if group else version, []):
                    entry: Obj = {
                        "resource": rt.plural,
                        "responseKind": {"group": rt.group, "version": version, "kind": rt.kind},
                        "scope": "Namespaced" if rt.namespaced else "Cluster",
                        "singularResource": rt.singular,
                        "verbs": list(_VERBS),
                    }
                    if rt.short_names:
                        entry["shortNames"] = list(rt.short_names)
                    if rt.categories:
                        entry["categories"] = list(rt.categories)
                    if rt.subresources:
                        entry["subresources"] = [
                            {"subresource": sub,
                             "responseKind": {"group": rt.group, "version": version, "kind": rt.kind},
                             "verbs": {"status": ["get", "patch", "update"], "log": ["get"],
                                       "finalize": ["update"]}[sub]}
                            for sub in rt.subresources
                        ]
                    resources.append(entry)
            out_versions.append({"version": version, "resources": resources, "freshness": "Current"})
        meta: Obj = {"creationTimestamp": None}
        if group:
            meta["name"] = group
        return {"metadata": meta, "versions": out_versions}

    # -- OpenAPI ---------------------------------------------------------------------

    def _openapi(self, req: Request, rest: list[str]) -> Response:
        if rest == ["v2"]:
            accept = req.headers.get("accept", "")
            if "json" not in accept or "protobuf" in accept.split(",")[0]:
                raise _NOT_FOUND  # kubectl asks for protobuf only; a 404 makes it fall back
            return _json({"swagger": "2.0", "info": {"title": "Kubernetes", "version": VERSION_INFO["gitVersion"]},
                          "paths": {}, "definitions": {}})
        if rest == ["v3"]:
            index: dict[str, Any] = {}
            for gv in group_versions():
                prefix = "apis/" + gv if "/" in gv else "api/" + gv
                index[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash=0123456789ABCDEF"}
            return _json({"paths": index})
        if len(rest) >= 3 and rest[0] == "v3":
            gv = "/".join(rest[2:]) if rest[1] == "apis" else "/".join(rest[2:])
            rts = group_versions().get(gv)
            if not rts:
                raise _NOT_FOUND
            paths: dict[str, Any] = {}
            for rt in rts:
                version = gv.rsplit("/", 1)[-1]
                base = f"/{'apis' if rt.group else 'api'}/{gv}"
                item = (f"{base}/namespaces/{{namespace}}/{rt.plural}/{{name}}" if rt.namespaced
                        else f"{base}/{rt.plural}/{{name}}")
                paths[item] = {"patch": {
                    "x-kubernetes-group-version-kind": {"group": rt.group, "version": version, "kind": rt.kind},
                    "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "OK"}},
                }}
            return _json({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION_INFO["gitVersion"]},
                          "paths": paths, "components": {"schemas": {}}})
        raise _NOT_FOUND


def _cut_after(stream: Iterator[bytes | None], events: int) -> Iterator[bytes | None]:
    """End a watch stream (cleanly) after ``events`` events: a server closing the watch mid-stream."""
    sent = 0
    try:
        if events <= 0:
            return
        for chunk in stream:
            yield chunk
            if chunk:
                sent += 1
                if sent >= events:
                    return
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def _container_finished(pod: Obj, container: str) -> bool:
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return True
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container and (cs.get("state") or {}).get("terminated"):
            return True
    return False


# ---------------------------------------------------------------------------
# HTTP plumbing (stdlib)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("sim.apiserver.request " + format, *args)

    def _serve(self) -> None:
        split = urlsplit(self.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = self._read_chunked()
        headers = {k.lower(): v for k, v in self.headers.items()}
        req = Request(self.command, unquote(split.path), query, headers, body)
        resp = self.server.api.handle(req)
        if resp.drop:  # an injected fault: the connection goes away without an answer
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        reason = HTTPStatus(resp.status).phrase if resp.status in HTTPStatus._value2member_map_ else ""
        self.send_response_only(resp.status, reason)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in resp.headers.items():
            self.send_header(k, v)
        if resp.stream is None:
            self.send_header("Content-Length", str(len(resp.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(resp.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        self._stream(resp.stream)

    def _read_chunked(self) -> bytes:
        out = b""
        while True:
            size = int(self.rfile.readline().strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return out
            out += self.rfile.read(size)
            self.rfile.readline()

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True

    def _stream(self, stream: Iterator[bytes | None]) -> None:
        try:
            for chunk in stream:
                if chunk is None:
                    if self._client_gone() or self.server.stopping:
                        self.close_connection = True
                        return
                    continue
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def __init__(self, address: tuple[str, int], api: Api):
        self.api = api
        self.stopping = False
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (its timeout, during an injected latency) closed the connection
        before the answer: what a real API server shrugs off. Anything else is printed as before.
        (A printed traceback also runs ``ast.parse`` on this thread, which races another thread's
        on CPython 3.11: gh-106905.)"""
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


class ApiServer:
    """The HTTP server in a background thread; `stop()` ends it and its watches."""

    def __init__(self, store: Store, host: str = "127.0.0.1", port: int = 0):
        self.store = store
        self.api = Api(store)
        self._httpd = _HTTPServer((host, port), self.api)
        self.host: str = host
        self.port: int = int(self._httpd.server_address[1])
        self.api.server_address = f"{self.host}:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"sim-apiserver-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.stopping = True
        self.store.close()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


__all__ = [
    "Api",
    "ApiServer",
    "PodLogBuffer",
    "default_pending_workloads",
    "format_time",
    "pod_log_buffer",
    "register_log_provider",
    "register_usage_provider",
    "register_visibility_provider",
]
