"""REST endpoints of subscriptions (docs/architecture/notifications.md, "REST"):

``GET/POST /v1/subscriptions``, ``GET/PATCH/DELETE /v1/subscriptions/{id}``,
``POST /v1/subscriptions/{id}:test``, ``POST /v1/subscriptions/{id}:rotateSecret``
and ``GET /v1/subscriptions/{id}/deliveries`` (the delivery log). Thin: parse
the JSON body, call ``notifications.services`` with the caller's identity,
answer lowerCamelCase JSON; errors leave in the API's ``{"error": ...}`` shape
through `xmc.api.rest.rest_exception_handler`. Registered into
``xmc.api.extensions`` by ``notifications.apps`` (mounted before the API's
catch-all 404, documented in ``/v1/openapi.json``).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.urls import URLPattern, path, re_path
from rest_framework.request import Request
from rest_framework.response import Response

from notifications import services
from notifications.models import Channel, Delivery, Scope, Subscription
from xmc.api.rest import BearerView, rest_exception_handler
from xmc.auth.identity import Identity
from core import inputs
from core.errors import InvalidArgument, NotFound


def _time(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def subscription_json(sub: Subscription, secret: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f"subscriptions/{sub.id}", "subscriber": sub.owner, "events": list(sub.events),
                           "enabled": sub.enabled, "queuedMinutes": sub.queued_minutes,
                           "rateLimitPerHour": sub.rate_limit_per_hour,
                           "createTime": _time(sub.create_time), "updateTime": _time(sub.update_time)}
    if sub.group:
        out["group"] = sub.group
    if sub.scope == Scope.EXPERIMENT:
        out["experiment"] = f"experiments/{sub.experiment_id}"
    elif sub.scope == Scope.FILTER:
        out["filter"] = sub.filter
    elif sub.scope == Scope.MINE:
        out["allMyExperiments"] = True
    if sub.channel == Channel.WEBHOOK:
        out["webhook"] = {"url": sub.url}
    elif sub.channel == Channel.SLACK:
        out["slack"] = {"url": sub.url}
    else:
        out["email"] = {"address": sub.email}
    if sub.quiet_start is not None and sub.quiet_end is not None:
        out["quietHours"] = {"start": sub.quiet_start.strftime("%H:%M"), "end": sub.quiet_end.strftime("%H:%M")}
    if secret is not None:
        out["webhookSecret"] = secret  # only in the answer of create and rotateSecret
    note = services.overlap_note(sub)
    if note:  # a rotation's overlap: the previous secret still signs until then
        out["previousSecretExpireTime"] = _time(sub.previous_secret_expires)
        out["previousSecretNote"] = note
    return out


def delivery_json(d: Delivery) -> dict[str, Any]:
    return {"id": d.message_id, "type": d.type, "status": d.status, "attempts": d.attempts,
            "eventCount": d.items.count(), "lastStatusCode": d.last_status_code, "lastError": d.last_error,
            "createTime": _time(d.create_time), "deliveredTime": _time(d.delivered_time),
            "attemptLog": [{"number": a.number, "time": _time(a.time), "statusCode": a.status_code, "ok": a.ok,
                            "latencyMs": a.latency_ms, "error": a.error} for a in d.attempt_log.all()]}


def _identity(request: Request) -> Identity:
    return request.user.identity


def _body(request: Request) -> Any:
    """The JSON body through the one input layer (`core.inputs.parse_json`: bounded depth and integers,
    no NUL or lone surrogate); a body nested 100,000 deep made ``json.loads`` recurse past the limit (500)."""
    parsed = inputs.parse_json(request.body, "request body")
    return {} if parsed is None else parsed


def _sid(raw: str) -> int:
    # ASCII digits only: str.isdigit() also takes "¹" or "٣", which int() refuses (a 500 the fuzz found).
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise NotFound(f"subscriptions/{raw} not found", field="name")
    return int(raw)


class _View(BearerView):
    pass


class CollectionView(_View):
    http_method_names = ["get", "post"]

    def get(self, request: Request) -> Response:
        return Response({"subscriptions": [subscription_json(s) for s in services.list_for(_identity(request))]})

    def post(self, request: Request) -> Response:
        created = services.create(_identity(request), _body(request))
        return Response(subscription_json(created.subscription, created.secret), status=200)


class ItemView(_View):
    http_method_names = ["get", "patch", "delete"]

    def get(self, request: Request, sid: str) -> Response:
        return Response(subscription_json(services.get(_identity(request), _sid(sid))))

    def patch(self, request: Request, sid: str) -> Response:
        return Response(subscription_json(services.update(_identity(request), _sid(sid), _body(request))))

    def delete(self, request: Request, sid: str) -> Response:
        services.delete(_identity(request), _sid(sid))
        return Response({})


class TestView(_View):
    http_method_names = ["post"]

    def post(self, request: Request, sid: str) -> Response:
        delivery = services.send_test(_identity(request), _sid(sid))
        return Response({"delivery": delivery.message_id, "status": delivery.status})


class RotateView(_View):
    http_method_names = ["post"]

    def post(self, request: Request, sid: str) -> Response:
        created = services.rotate_secret(_identity(request), _sid(sid))
        return Response(subscription_json(created.subscription, created.secret))


class DeliveriesView(_View):
    http_method_names = ["get"]

    def get(self, request: Request, sid: str) -> Response:
        rows = services.deliveries(_identity(request), _sid(sid))
        return Response({"deliveries": [delivery_json(d) for d in rows]})


urlpatterns: list[URLPattern] = [
    path("v1/subscriptions", CollectionView.as_view(), name="rest-subscriptions"),
    re_path(r"^v1/subscriptions/(?P<sid>[^/:]+):test$", TestView.as_view(), name="rest-subscription-test"),
    re_path(r"^v1/subscriptions/(?P<sid>[^/:]+):rotateSecret$", RotateView.as_view(),
            name="rest-subscription-rotate"),
    re_path(r"^v1/subscriptions/(?P<sid>[^/:]+)/deliveries$", DeliveriesView.as_view(),
            name="rest-subscription-deliveries"),
    re_path(r"^v1/subscriptions/(?P<sid>[^/:]+)$", ItemView.as_view(), name="rest-subscription"),
]


def openapi_paths() -> dict[str, Any]:
    """The subscription endpoints in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    body = {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
    ok = {"description": "the subscription (JSON), see docs/architecture/notifications.md",
          "content": {"application/json": {"schema": {"type": "object"}}}}
    sid = [{"name": "sid", "in": "path", "required": True, "schema": {"type": "string"},
            "description": "subscription id"}]

    def op(op_id: str, summary: str, path_template: str, *, with_body: bool = False,
           params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"operationId": op_id, "x-path-template": path_template, "x-not-an-rpc": True,
                               "tags": ["notifications"], "summary": summary, "parameters": params or [],
                               "responses": {"200": ok, "400": error, "401": error, "403": error, "404": error}}
        if with_body:
            out["requestBody"] = body
        return out

    item = "/v1/subscriptions/{sid}"
    return {
        "/v1/subscriptions": {
            "get": op("ListSubscriptions", "The caller's subscriptions", "/v1/subscriptions"),
            "post": op("CreateSubscription", "Subscribe (a webhook's secret is answered only here)",
                       "/v1/subscriptions", with_body=True)},
        item: {
            "get": op("GetSubscription", "One of the caller's subscriptions", item, params=sid),
            "patch": op("UpdateSubscription", "Change events, url, quiet hours, limits, enabled", item,
                        with_body=True, params=sid),
            "delete": op("DeleteSubscription", "Delete a subscription", item, params=sid)},
        item + ":test": {"post": op("TestSubscription", "Send a test message", item + ":test", params=sid)},
        item + ":rotateSecret": {"post": op("RotateSubscriptionSecret",
                                            "A new webhook secret; the previous signs for 24 h more",
                                            item + ":rotateSecret", params=sid)},
        item + "/deliveries": {"get": op("ListSubscriptionDeliveries", "The delivery log: messages and every try",
                                         item + "/deliveries", params=sid)},
    }
