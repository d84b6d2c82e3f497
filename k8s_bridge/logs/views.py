"""``GET /v1/experiments/{xid}/workUnits/{wid}/executions/{eid}/logs``: an execution's container logs.

Mounted by ``xmc.api.rest_urls`` (registered into `xmc.api.extensions` by ``K8sBridgeConfig.ready``) before the API's catch-all 404; documented in
the OpenAPI document (`k8s_bridge.logs.views.openapi_paths`) and in
docs/architecture/logs.md. Thin: authenticate (bearer, per-identity rate
limit), check who may read (`k8s_bridge.logs.views.readable_execution`), validate the
query, then `k8s_bridge.logs.service.open_logs` chooses live pod or archive
and this view streams the lines.

Access: the reader role on the experiment, as GetWorkUnit. Unlike the RPCs
(PERMISSION_DENIED for a stranger), a caller who may not read the
experiment gets the very 404 a missing execution gets: a log URL is
shareable, and its answer must say nothing about what exists.

Query (every parameter optional; anything else is 400 naming it):

* ``replica`` -- ``<replicatedJob>-<jobIndex>`` (``-<podIndex>`` when a job
  runs several pods), default the first; ``all``: every replica interleaved
  by time (not with ``follow``);
* ``container`` -- default the pod's first container;
* ``follow`` -- keep the response open and send lines as they are written,
  until the container stops, or until the caller may no longer read the
  experiment: access is checked again before a line is sent when the last
  check is older than ``min(1 s, XMC_STREAM_RECHECK_S)`` (`still_readable`),
  and the response ends there (a reconnect gets 404);
* ``tailLines`` -- the last N lines (after ``sinceTime``);
* ``sinceTime`` -- RFC 3339; lines written at or after it;
* ``previous`` -- the container's previous instance (before its last restart);
* ``timestamps`` -- prefix each text line with its RFC 3339 time;
* ``format`` -- ``text`` (default, ``text/plain``) or ``ndjson``
  (``application/x-ndjson``: one ``{"replica", "pod", "container",
  "timestamp", "text", "source"}`` object per line).

Response headers say what was chosen: ``X-XMC-Log-Source`` (``cluster`` or
``archive``: the pod is gone, this is its archived log), ``X-XMC-Log-Replica``,
``X-XMC-Log-Replicas`` (all of them, comma-separated), ``X-XMC-Log-Pod``,
``X-XMC-Log-Container``, ``X-XMC-Log-Containers``, ``X-XMC-Log-Archived-At``,
``X-XMC-Log-Truncated``, ``X-XMC-Log-Note`` (why there are no lines, e.g.
still pulling the image), ``X-XMC-Log-Waiting`` (``true``: no container has
started yet, so a follower asks again) and ``X-XMC-Logs-Console-URL`` (the cluster's log
explorer, from ``XMC_LOGS_CONSOLE_URL_TEMPLATE``).
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpResponseBase, StreamingHttpResponse
from django.urls import URLPattern, path
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from experiments import acl
from experiments.acl import Role
from experiments.models import Experiment
from k8s_bridge.logs import service, slots
from k8s_bridge.logs.pods import parse_time
from k8s_bridge.logs.service import LogLine, LogQuery, LogStream
from workunits.models import WorkUnitExecution
from xmc.api.rest import BearerView
from xmc.auth.drf import IdentityUser
from xmc.auth.identity import Identity, Unauthenticated, authenticate_bearer
from core import names
from core.errors import InvalidArgument, NotFound, ResourceExhausted

PARAMETERS = ("replica", "container", "follow", "tailLines", "sinceTime", "previous", "timestamps", "format")
FORMATS = {"text": "text/plain; charset=utf-8", "ndjson": "application/x-ndjson"}
#: the longest a follow response stays open (the client reconnects with sinceTime)
FOLLOW_MAX_S = 3600.0
_INT64 = 2**63 - 1
_REPLICA = re.compile(r"^[a-z0-9]([-a-z0-9]{0,298}[a-z0-9])?$")
_CONTAINER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PATH = "v1/experiments/<id:xid>/workUnits/<id:wid>/executions/<id:eid>/logs"


# --- access -----------------------------------------------------------------------------------


def readable_execution(identity: Identity, xid: int, wid: int, eid: int) -> Mapping[str, Any]:
    """The execution's metadata if ``identity`` may read it; else the same NotFound as a missing one."""
    name = f"experiments/{xid}/workUnits/{wid}/executions/{eid}"
    missing = NotFound(f"{name} not found", field="name")
    if not (0 < xid <= _INT64 and 0 < wid <= _INT64 and 0 < eid <= _INT64):
        raise missing
    acls = Experiment.objects.filter(id=xid).values_list("acls", flat=True).first()
    if acls is None or acl.role_of(identity, acls) < Role.READER:
        raise missing
    row = (WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, work_unit__wid=wid, eid=eid)
           .values_list("metadata", flat=True).first())
    if row is None:
        raise missing
    return row or {}


def still_readable(header: str, xid: int, wid: int, eid: int) -> bool:
    """The bearer of ``header`` may still read the execution: its token verified again (a deactivated
    account or a revoked token fails), the experiment's ACL read again."""
    try:
        readable_execution(authenticate_bearer(header), xid, wid, eid)
    except (Unauthenticated, NotFound):
        return False
    return True


# --- the query --------------------------------------------------------------------------------


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return False
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise InvalidArgument(f"{name} must be true or false, not {value!r}", field=name)


def parse_query(params: Mapping[str, list[str]]) -> tuple[LogQuery, str, bool]:
    """(the service's query, the format, timestamps) from the request's query string."""
    for key, values in params.items():
        if key not in PARAMETERS:
            raise InvalidArgument(f"unknown query parameter {key!r}; allowed: {', '.join(PARAMETERS)}", field=key)
        if len(values) > 1:
            raise InvalidArgument(f"{key} is given {len(values)} times", field=key)
    query = {k: v[0] for k, v in params.items()}
    replica = query.get("replica") or None
    if replica is not None and not _REPLICA.match(replica):
        raise InvalidArgument("replica must be <job>-<index> (lower-case letters, digits, '-') or 'all'",
                              field="replica")
    container = query.get("container") or None
    if container is not None and not _CONTAINER.match(container):
        raise InvalidArgument("container must be a container name (a DNS-1123 label)", field="container")
    tail: int | None = None
    if query.get("tailLines") not in (None, ""):
        raw = query["tailLines"]
        if not (raw.isascii() and raw.isdigit()):
            raise InvalidArgument(f"tailLines must be a whole number >= 0, not {raw!r}", field="tailLines")
        tail = int(raw)
        if tail > service.MAX_LINES:
            raise InvalidArgument(f"tailLines must be at most {service.MAX_LINES}", field="tailLines")
    since: datetime | None = None
    if query.get("sinceTime") not in (None, ""):
        raw = query["sinceTime"]
        since = parse_time(raw)
        if since is None:
            raise InvalidArgument(f"sinceTime must be an RFC 3339 time such as 2026-01-02T03:04:05Z, not {raw!r}",
                                  field="sinceTime")
    fmt = query.get("format") or "text"
    if fmt not in FORMATS:
        raise InvalidArgument(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}", field="format")
    follow = _flag(query, "follow")
    previous = _flag(query, "previous")
    if follow and previous:
        raise InvalidArgument("follow cannot be combined with previous (a previous instance has stopped)",
                              field="follow")
    return (LogQuery(replica=replica, container=container, follow=follow, previous=previous, tail_lines=tail,
                     since=since), fmt, _flag(query, "timestamps"))


# --- the response -----------------------------------------------------------------------------


def render(lines: Iterator[LogLine], fmt: str, timestamps: bool, *, prefix_replica: bool,
           deadline: float | None = None, allowed: Callable[[], bool] | None = None) -> Iterator[bytes]:
    try:
        yield from _render(lines, fmt, timestamps, prefix_replica=prefix_replica, deadline=deadline,
                           allowed=allowed)
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            close()  # the cluster stream goes with the response (client gone, deadline)


def _render(lines: Iterator[LogLine], fmt: str, timestamps: bool, *, prefix_replica: bool,
            deadline: float | None, allowed: Callable[[], bool] | None) -> Iterator[bytes]:
    checked = time.monotonic()
    for line in lines:
        # A followed log checks access again before it sends a line, when its last check is older than
        # min(1 s, XMC_STREAM_RECHECK_S): lost access (or a deactivated account) ends the response.
        if allowed is not None and time.monotonic() - checked >= min(1.0, settings.XMC_STREAM_RECHECK_S):
            if not allowed():
                return
            checked = time.monotonic()
        if fmt == "ndjson":
            yield json.dumps({"replica": line.replica, "pod": line.pod, "container": line.container,
                              "timestamp": line.timestamp, "text": line.text, "source": line.source},
                             ensure_ascii=False).encode() + b"\n"
        else:
            head = f"[{line.replica}] " if prefix_replica else ""
            stamp = f"{line.timestamp} " if timestamps and line.timestamp else ""
            yield f"{head}{stamp}{line.text}\n".encode()
        if deadline is not None and time.monotonic() > deadline:
            return


def headers(stream: LogStream) -> dict[str, str]:
    out = {
        "X-XMC-Log-Source": stream.source,
        "X-XMC-Log-Replica": stream.replica,
        "X-XMC-Log-Replicas": ",".join(stream.replicas),
        "X-XMC-Log-Pod": stream.pod,
        "X-XMC-Log-Container": stream.container,
        "X-XMC-Log-Containers": ",".join(stream.containers),
        "Cache-Control": "no-store",
        # nginx-style proxies must not buffer a followed log
        "X-Accel-Buffering": "no",
    }
    if stream.archived_at is not None:
        out["X-XMC-Log-Archived-At"] = stream.archived_at.isoformat().replace("+00:00", "Z")
    if stream.truncated:
        out["X-XMC-Log-Truncated"] = "true"
    if stream.note:
        out["X-XMC-Log-Note"] = stream.note.encode("ascii", "replace").decode()[:500]
    if stream.console_url:
        out["X-XMC-Logs-Console-URL"] = stream.console_url
    if stream.waiting:
        out["X-XMC-Log-Waiting"] = "true"
    return {k: v for k, v in out.items() if v != ""}


class _Releasing:
    """``chunks``, giving the follow slot back once: at the end, or when Django closes the
    response (the client went away), even if it was never iterated."""

    def __init__(self, chunks: Iterator[bytes], user: str) -> None:
        self._chunks = chunks
        self._user = user
        self._released = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._chunks
        finally:
            self.close()

    def close(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            slots.release(self._user)


class ExecutionLogsView(BearerView):
    http_method_names = ["get"]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[Any, str]:
        # Errors are JSON; our own ``format`` parameter is not DRF's URL format override.
        renderer = JSONRenderer()
        return renderer, renderer.media_type

    def get(self, request: Request, xid: int, wid: int, eid: int) -> HttpResponseBase:
        user = request.user
        assert isinstance(user, IdentityUser)
        metadata = readable_execution(user.identity, xid, wid, eid)
        query, fmt, timestamps = parse_query(dict(request.query_params.lists()))
        namespace = str(metadata.get("namespace") or settings.XMC_K8S_NAMESPACE)
        held = False
        who = user.identity.email
        if query.follow:
            # A followed log holds one of the process's few request threads while it is open:
            # a global cap, and a fair share of it per user (k8s_bridge.logs.slots).
            if not slots.acquire(who):
                raise ResourceExhausted(
                    f"this server follows as many logs as it may ({settings.XMC_LOGS_MAX_FOLLOWS}, and a fair share "
                    f"of them for {who}: {slots.held(who)} open); retry shortly, or poll without follow using "
                    "sinceTime", field="follow")
            held = True
        try:
            stream = service.open_logs(xid, wid, eid, namespace, query)
        except BaseException:
            if held:
                slots.release(who)
            raise
        deadline = time.monotonic() + FOLLOW_MAX_S if query.follow else None
        header = str(request.headers.get("Authorization", ""))
        body = render(stream.lines, fmt, timestamps, prefix_replica=stream.replica == service.ALL_REPLICAS,
                      deadline=deadline, allowed=(lambda: still_readable(header, xid, wid, eid)) if query.follow else None)
        if held:
            body = _Releasing(body, who)  # type: ignore[assignment]
        response = StreamingHttpResponse(body, content_type=FORMATS[fmt])
        for key, value in headers(stream).items():
            response[key] = value
        return response


def openapi_paths() -> dict[str, Any]:
    """This endpoint in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    def param(name: str, where: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
        return {"name": name, "in": where, "required": where == "path", "schema": schema, "description": description}

    line_schema = {"type": "object", "properties": {
        "replica": {"type": "string"}, "pod": {"type": "string"}, "container": {"type": "string"},
        "timestamp": {"type": "string", "format": "date-time"}, "text": {"type": "string"},
        "source": {"type": "string", "enum": ["cluster", "archive"]}}}
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    header_names = ["X-XMC-Log-Source", "X-XMC-Log-Replica", "X-XMC-Log-Replicas", "X-XMC-Log-Pod",
                    "X-XMC-Log-Container", "X-XMC-Log-Containers", "X-XMC-Log-Archived-At", "X-XMC-Log-Truncated",
                    "X-XMC-Log-Note", "X-XMC-Log-Waiting", "X-XMC-Logs-Console-URL"]
    return {"/v1/experiments/{xid}/workUnits/{wid}/executions/{eid}/logs": {"get": {
        "operationId": "GetExecutionLogs",
        "x-path-template": "/v1/experiments/{xid}/workUnits/{wid}/executions/{eid}/logs",
        "x-not-an-rpc": True,  # no gRPC equivalent: the protos have no log call
        "tags": ["logs"],
        "summary": "An execution's container logs: live from the pod, or archived once it is gone",
        "description": (
            "Reader access on the experiment (as GetWorkUnit); a caller who may not read it gets 404, as for a "
            "missing execution. Lines come from the pod while it exists (`pods/log` through the Kubernetes API) "
            "and from the log archive afterwards (`X-XMC-Log-Source: archive`). `sinceTime` applies before "
            "`tailLines`. With `follow=true` the response stays open and lines arrive as the container writes "
            "them; it ends when the container stops. See docs/architecture/logs.md."),
        "parameters": [
            param("xid", "path", {"type": "string"}, "experiment id"),
            param("wid", "path", {"type": "string"}, "work unit id"),
            param("eid", "path", {"type": "string"}, "execution id"),
            param("replica", "query", {"type": "string"},
                  "`<replicatedJob>-<jobIndex>` (e.g. `main-0`; `-<podIndex>` appended when a job runs several "
                  "pods); default the first; `all` interleaves every replica by time (not with follow)"),
            param("container", "query", {"type": "string"}, "default: the pod's first container"),
            param("follow", "query", {"type": "boolean"}, "stream new lines until the container stops"),
            param("tailLines", "query", {"type": "integer", "minimum": 0, "maximum": service.MAX_LINES},
                  "only the last N lines"),
            param("sinceTime", "query", {"type": "string", "format": "date-time"},
                  "only lines written at or after this RFC 3339 time"),
            param("previous", "query", {"type": "boolean"}, "the container's instance before its last restart"),
            param("timestamps", "query", {"type": "boolean"}, "prefix text lines with their RFC 3339 time"),
            param("format", "query", {"type": "string", "enum": list(FORMATS)},
                  "`text` (text/plain, default) or `ndjson` (one JSON object per line)"),
        ],
        "responses": {
            "200": {"description": "the log",
                    "headers": {h: {"schema": {"type": "string"}} for h in header_names},
                    "content": {"text/plain": {"schema": {"type": "string"}},
                                "application/x-ndjson": {"schema": line_schema}}},
            "400": error, "401": error, "404": error, "429": error, "503": error,  # 429: too many follows
        },
    }}}


names.register_converters()  # <id:...>: ids spelled once (core.names.IdConverter)
urlpatterns: list[URLPattern] = [
    path(PATH, ExecutionLogsView.as_view(), name="rest-execution-logs"),
]

