"""Staff-only REST endpoints of the scheduling switch (API.md, Operators).

``GET /v1/scheduling`` (status), ``POST /v1/scheduling:pause`` (body
``{"reason": "..."}``) and ``POST /v1/scheduling:resume`` (optional body
``{"batchSize": N}``). Mounted by ``xmc.api.rest_urls`` before the API's
catch-all 404. Thin: validate the body, call ``workunits.scheduling``,
answer JSON in lowerCamelCase; errors leave through
`xmc.api.rest.rest_exception_handler` in the API's ``{"error": ...}`` shape
(non-staff: PERMISSION_DENIED 403). Resume hands the run to the
``resumption`` queue and answers at once with its id.
"""
from __future__ import annotations

from typing import Any

from django.urls import URLPattern, path
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from core import inputs
from core.errors import InvalidArgument
from workunits import scheduling
from xmc.api.rest import BearerView, rest_exception_handler


class IsStaff(BasePermission):
    message = "only staff may read or change the scheduling switch"

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and getattr(user, "is_staff", False))


def status_json(status: scheduling.SchedulingStatus) -> dict[str, Any]:
    return {
        "paused": status.paused,
        "since": status.since.isoformat().replace("+00:00", "Z") if status.since else None,
        "changedBy": status.changed_by,
        "reason": status.reason,
        "pendingPausedTasks": status.pending_paused_tasks,
    }


def _body(request: Request, allowed: dict[str, type]) -> dict[str, Any]:
    """The JSON object body with only ``allowed`` fields of the right JSON type ({} when empty)."""
    data = inputs.parse_json(request.body)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument("the request body must be a JSON object")
    for key, value in data.items():
        kind = allowed.get(key)
        if kind is None:
            raise InvalidArgument(f"unknown field {key!r}; allowed: {', '.join(allowed) or 'none'}", field=key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise InvalidArgument(f"{key} must be a {'string' if kind is str else 'integer'}", field=key)
    return data


class _SchedulingView(BearerView):
    permission_classes = (IsStaff,)


class StatusView(_SchedulingView):
    http_method_names = ["get"]

    def get(self, request: Request) -> Response:
        return Response(status_json(scheduling.get_status()))


class PauseView(_SchedulingView):
    http_method_names = ["post"]

    def post(self, request: Request) -> Response:
        data = _body(request, {"reason": str})
        if "reason" not in data:
            raise InvalidArgument("reason is required: say why scheduling is paused", field="reason")
        status = scheduling.pause(reason=data["reason"], by=request.user.email)
        return Response(status_json(status))


class ResumeView(_SchedulingView):
    http_method_names = ["post"]

    def post(self, request: Request) -> Response:
        data = _body(request, {"batchSize": int})
        batch_size = data.get("batchSize", scheduling.DEFAULT_BATCH_SIZE)
        try:
            result = scheduling.resume(by=request.user.email, batch_size=batch_size)
        except InvalidArgument as exc:
            if exc.field == "batch_size":
                raise InvalidArgument(exc.message.replace("batch_size", "batchSize"), field="batchSize") from None
            raise
        return Response({**status_json(result.status), "resumptionRunId": str(result.run_id),
                         "wasPaused": result.was_paused})


urlpatterns: list[URLPattern] = [
    path("v1/scheduling", StatusView.as_view(), name="rest-scheduling-status"),
    path("v1/scheduling:pause", PauseView.as_view(), name="rest-scheduling-pause"),
    path("v1/scheduling:resume", ResumeView.as_view(), name="rest-scheduling-resume"),
]
