"""``POST /v1/experiments/{xid}/workUnits/{wid}/metrics:write``: running jobs report metric points.

Mounted by ``xmc.api.rest_urls`` beside the RPC bindings; documented in the
OpenAPI document (`openapi_paths`). Body, proto3 JSON::

    {"points": [{"metric": "loss", "step": 10, "value": 0.5, "time": "2026-12-01T10:00:00Z"}],
     "executionId": "2"}

``time`` is optional (the server's clock when absent; at most
``XMC_METRICS_MAX_FUTURE_S`` ahead of it), ``executionId`` too
(the token's execution, or the work unit's current one for a user token).
At most ``XMC_METRICS_MAX_POINTS`` points per call. Writes are idempotent on
(execution, metric, step) (`metrics.services.write_points`): a retried batch
does not double points. The answer is ``{"written": n, "duplicates": m}``.

Who may write: ``Authorization: Bearer <XMC_METRICS_TOKEN>``, the token the
actuator gave the execution's containers (`metrics.tokens`), for that
execution only and until it ended plus ``XMC_METRICS_TOKEN_GRACE_S``; or a
user's bearer token with write rights on the experiment. Each execution may
make ``XMC_METRICS_WRITES_PER_S`` calls a second (burst
``XMC_METRICS_WRITES_BURST``; `meter`): more get 429 / RESOURCE_EXHAUSTED with
``Retry-After``. Errors have the API's shape and name the field
(``points[3].value``).
"""
from __future__ import annotations

import math
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, JsonResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from core import inputs, names, ratelimit
from core.errors import InvalidArgument, PermissionDenied, ResourceExhausted, ServiceError, Unauthenticated
from core.protos import metrics_pb2
from experiments.acl import Role
from metrics import services, specs, tokens
from xmc.api import reads
from xmc.api.rest import HTTP_STATUS, error_body
from xmc.auth.identity import Unauthenticated as BadToken
from xmc.auth.identity import authenticate_bearer
from xmc.ops import observe_rpc

PATH = "v1/experiments/<id:xid>/workUnits/<id:wid>/metrics:write"
_INT64 = 2**63 - 1
#: Integers as large as this are values a float holds (beyond ~1.8e308 ``float()`` overflows).
_FLOAT_INT = 2**1000


def _error(exc: ServiceError) -> JsonResponse:
    status = HTTP_STATUS.get(exc.code, 500)
    response = JsonResponse(error_body(status, exc.code, exc.message, field=exc.field), status=status)
    if isinstance(exc, _Throttled):
        response["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return response


class _Throttled(ResourceExhausted):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def meter(execution: int) -> None:
    """Take one call of ``execution``'s budget (``XMC_METRICS_WRITES_PER_S``, burst
    ``XMC_METRICS_WRITES_BURST``; a bucket per execution in Redis, `core.ratelimit`), or raise
    RESOURCE_EXHAUSTED with when to retry. Redis down: the call goes through (the limiter logs it)."""
    decision = ratelimit.limiter_for(settings.XMC_METRICS_WRITES_PER_S, settings.XMC_METRICS_WRITES_BURST).check(
        f"metrics-write:{execution}")
    if not decision.allowed:
        raise _Throttled(f"this execution writes metrics more often than XMC_METRICS_WRITES_PER_S "
                         f"({settings.XMC_METRICS_WRITES_PER_S:g} calls a second) allows: send larger batches "
                         f"less often; retry after {decision.retry_after_s:.1f} s", decision.retry_after_s)


def _int(value: Any, field: str) -> int:
    return inputs.parse_int(value, field, low=-_INT64 - 1, high=_INT64)


def _time(value: Any, field: str, now: datetime) -> datetime:
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be an RFC 3339 timestamp string", field=field)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(f"{field} is not an RFC 3339 timestamp (got {value[:40]!r})", field=field) from None
    if parsed.tzinfo is None:
        raise InvalidArgument(f"{field} needs a time zone (e.g. 'Z')", field=field)
    if not 1970 <= parsed.year <= 9999:
        raise InvalidArgument(f"{field} is out of range", field=field)
    ahead = (parsed - now).total_seconds()
    if ahead > settings.XMC_METRICS_MAX_FUTURE_S:
        # Retention drops points by time; one from the far future would never go (metrics.partitions).
        raise InvalidArgument(f"{field} is {ahead:.0f} s ahead of the server's clock; at most "
                              f"XMC_METRICS_MAX_FUTURE_S ({settings.XMC_METRICS_MAX_FUTURE_S} s) ahead, or leave "
                              "it out for the server's time", field=field)
    return parsed


_BODY_FIELDS = frozenset({"points", "executionId", "execution_id"})
_POINT_FIELDS = frozenset({"metric", "step", "value", "time"})


def _point(i: int, item: Any, now: datetime) -> services.Point:
    """One point, every rule checked in order: the 400 naming the first bad field of ``points[i]``."""
    where = f"points[{i}]"
    if not isinstance(item, dict):
        raise InvalidArgument(f"{where} must be an object", field=where)
    extra = set(item) - _POINT_FIELDS
    if extra:
        raise InvalidArgument(f"{where}: unknown field {sorted(extra)[0][:80]!r}", field=where)
    metric = item.get("metric")
    if not isinstance(metric, str) or not specs.METRIC_PATTERN.fullmatch(metric) or not metric.strip():
        raise InvalidArgument(f"{where}.metric must be 1 to 256 printable characters", field=f"{where}.metric")
    step = _int(item.get("step", 0), f"{where}.step")
    value = item.get("value")
    number = None
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            pass
    if number is None or not math.isfinite(number):
        raise InvalidArgument(f"{where}.value must be a finite number", field=f"{where}.value")
    time = _time(item["time"], f"{where}.time", now) if item.get("time") else now
    return services.Point(metric, step, number, time)


def parse_points(body: Any, now: datetime) -> tuple[list[services.Point], int | None]:
    """The points and the ``executionId`` of a request body (INVALID_ARGUMENT naming the bad field).

    The loop takes a fast path for the common point (a known-good metric name,
    an int step, a float value, a time string already seen in this body);
    anything else goes through `_point`, which checks every rule and raises
    the same error it always did.
    """
    if not isinstance(body, dict):
        raise InvalidArgument("the body must be a JSON object with 'points'", field="points")
    unknown = set(body) - _BODY_FIELDS
    if unknown:
        raise InvalidArgument(f"unknown field {sorted(unknown)[0][:80]!r}", field=sorted(unknown)[0][:80])
    raw_eid = body.get("executionId", body.get("execution_id"))
    eid = _int(raw_eid, "executionId") if raw_eid not in (None, "", 0, "0") else None
    if eid is not None and eid <= 0:
        raise InvalidArgument("executionId must be positive", field="executionId")
    items = body.get("points")
    if not isinstance(items, list) or not items:
        raise InvalidArgument("points must be a non-empty list", field="points")
    if len(items) > settings.XMC_METRICS_MAX_POINTS:
        raise InvalidArgument(f"points has {len(items)} entries; at most {settings.XMC_METRICS_MAX_POINTS} "
                              "per call", field="points")
    points: list[services.Point] = []
    append = points.append
    good_metrics: set[str] = set()
    times: dict[str, datetime] = {}
    fields = _POINT_FIELDS
    isfinite = math.isfinite
    Point = services.Point
    for i, item in enumerate(items):
        if type(item) is dict and fields.issuperset(item):
            metric = item.get("metric")
            step = item.get("step", 0)
            value = item.get("value")
            raw_time = item.get("time")
            if type(value) is int and -_FLOAT_INT <= value <= _FLOAT_INT:
                value = float(value)
            if (type(metric) is str and metric in good_metrics and type(step) is int and -_INT64 - 1 <= step <= _INT64
                    and type(value) is float and isfinite(value)):
                if not raw_time:
                    append(Point(metric, step, value, now))
                    continue
                if type(raw_time) is str and raw_time in times:
                    append(Point(metric, step, value, times[raw_time]))
                    continue
        point = _point(i, item, now)  # the full check (raises the 400), then remember what passed
        good_metrics.add(point.metric)
        raw_time = item.get("time")
        if raw_time and type(raw_time) is str:
            times[raw_time] = point.time
        append(point)
    return points, eid


def loads(raw: bytes) -> Any:
    """The JSON body: orjson, or the standard library for what orjson refuses (``NaN``, huge integers),
    so the answer to such a body is the same 400 naming the point as before.

    orjson takes the escape of NUL into a string; a body that may hold one (the six bytes ``\\u0000``,
    rarely a backslash before ``u0000``) goes to `core.inputs.parse_json`, which refuses NUL naming the field,
    as every other JSON body of the API is refused."""
    if b"\\u0000" in raw:
        return inputs.parse_json(raw, "body")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    return inputs.parse_json(raw, "body")


def execution_for(header: str, xid: int, wid: int, eid: int | None) -> int:
    """The pk of the execution the ``Authorization`` value may write points of (raises the error to answer)."""
    scheme, _, credential = header.partition(" ")
    credential = credential.strip()
    if scheme.lower() == "bearer" and tokens.looks_like_token(credential):
        key = tokens.verify(credential)
        if key is None:
            raise Unauthenticated("the metrics token does not verify")
        if (key.xid, key.wid) != (xid, wid) or (eid is not None and eid != key.eid):
            raise PermissionDenied(f"this metrics token writes only experiments/{key.xid}/workUnits/{key.wid}"
                                   f"/executions/{key.eid}")
        pk = services.accepting_execution(key.xid, key.wid, key.eid)
        if pk is None:
            raise PermissionDenied(f"execution {key.eid} of experiments/{xid}/workUnits/{wid} has ended; "
                                   "its metrics token no longer writes")
        return pk
    try:
        identity = authenticate_bearer(header or None)
    except BadToken as exc:
        raise Unauthenticated(str(exc)) from None
    reads.require_experiment_role(xid, identity, Role.WRITER)
    found = services.execution_pk(xid, wid, eid)
    if found is None:
        what = f"execution {eid} of " if eid is not None else ""
        raise InvalidArgument(f"{what}experiments/{xid}/workUnits/{wid} not found",
                              field="executionId" if eid is not None else None)
    return found


@csrf_exempt
def write_metrics(request: HttpRequest, xid: int, wid: int) -> JsonResponse:
    started = timezone.now()
    code = "OK"
    try:
        if request.method != "POST":
            code = "UNIMPLEMENTED"
            return JsonResponse(error_body(405, code, "metrics:write takes POST"), status=405)
        try:
            raw = request.body
        except RequestDataTooBig:
            code = "INVALID_ARGUMENT"
            return JsonResponse(error_body(413, "INVALID_ARGUMENT", "request body too large"), status=413)
        points, eid = parse_points(loads(raw or b"{}"), started)
        execution = execution_for(request.META.get("HTTP_AUTHORIZATION", ""), int(xid), int(wid), eid)
        meter(execution)
        written = services.write_points(execution, points)
        return JsonResponse({"written": written, "duplicates": len(points) - written})
    except ServiceError as exc:
        code = exc.code
        return _error(exc)
    except (OperationalError, InterfaceError):
        code = "UNAVAILABLE"
        return JsonResponse(error_body(503, "UNAVAILABLE", "database unavailable; retry later"), status=503)
    finally:
        observe_rpc("rest", "xmc.metrics.v1", "WriteMetrics", code, (timezone.now() - started).total_seconds())


names.register_converters()  # <id:...>: ids spelled once (core.names.IdConverter)
urlpatterns: list[URLPattern] = [path(PATH, write_metrics, name="metrics-write")]


def openapi_paths() -> dict[str, Any]:
    """This endpoint in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    point = {"type": "object", "required": ["metric", "value"], "properties": {
        "metric": {"type": "string"}, "step": {"type": "string", "format": "int64"},
        "value": {"type": "number"}, "time": {"type": "string", "format": "date-time"}}}
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {"/v1/experiments/{xid}/workUnits/{wid}/metrics:write": {"post": {
        "operationId": "WriteMetrics",
        "x-path-template": "/v1/experiments/{xid}/workUnits/{wid}/metrics:write",
        "x-not-an-rpc": True,
        "tags": ["metrics"],
        "summary": "Write metric points of an execution (idempotent on execution, metric, step)",
        "description": (
            "Authorization: the execution's XMC_METRICS_TOKEN (its containers have it), valid until the execution "
            "ended plus XMC_METRICS_TOKEN_GRACE_S, or a user token with write rights on the experiment. At most "
            "XMC_METRICS_MAX_POINTS points per call, XMC_METRICS_WRITES_PER_S calls a second per execution (429 with "
            "Retry-After beyond). See docs/architecture/metrics.md."),
        "parameters": [
            {"name": "xid", "in": "path", "required": True, "schema": {"type": "string"}, "description": "experiment id"},
            {"name": "wid", "in": "path", "required": True, "schema": {"type": "string"}, "description": "work unit id"},
        ],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object",
            "required": ["points"], "properties": {"points": {"type": "array", "items": point},
                                                   "executionId": {"type": "string", "format": "int64"}}}}}},
        "responses": {"200": {"description": "written", "content": {"application/json": {"schema": {
            "type": "object", "properties": {"written": {"type": "integer"}, "duplicates": {"type": "integer"}}}}}},
            "400": error, "401": error, "403": error, "413": error, "429": error},
    }}}


# --- The same over gRPC: xmc.metrics.v1.MetricsService (core/protos/metrics.proto) -------------

METRICS_SERVICE = metrics_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name
WRITE_METHOD = f"/{METRICS_SERVICE}/WriteMetrics"


def points_of(request: Any, now: datetime) -> tuple[list[services.Point], int | None]:
    """The points and execution id of a ``WriteMetricsRequest`` (validated as the JSON body is)."""
    body: dict[str, Any] = {"points": [
        {"metric": p.metric, "step": p.step, "value": p.value,
         **({"time": p.time.ToDatetime(tzinfo=dt_timezone.utc).isoformat()} if p.HasField("time") else {})}
        for p in request.points]}
    if request.execution_id:
        body["executionId"] = request.execution_id
    return parse_points(body, now)


def write_over_grpc(request: Any, authorization: str) -> Any:
    """WriteMetrics: parent, points, the caller's ``authorization`` metadata; raises ``ServiceError``."""
    xid, wid = names.parse_work_unit(request.parent, "parent")
    for i, point in enumerate(request.points):
        if point.HasField("time") and not (-62135596800 <= point.time.seconds <= 253402300799
                                           and 0 <= point.time.nanos < 10**9):
            raise InvalidArgument(f"points[{i}].time is not a valid timestamp", field=f"points[{i}].time")
    points, eid = points_of(request, timezone.now())
    execution = execution_for(authorization, xid, wid, eid)
    meter(execution)
    written = services.write_points(execution, points)
    return metrics_pb2.WriteMetricsResponse(written=written, duplicates=len(points) - written)
