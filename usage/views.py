"""``GET /v1/usage``: GPU- and CPU-hours rolled up by owner, experiment or queue (docs/architecture/usage.md).

Mounted through `xmc.api.extensions` by ``UsageConfig.ready``. Thin: bearer
authentication and the per-identity rate limit (`xmc.api.rest.BearerView`),
`usage.services.parse_query` (anything unknown or malformed is a 400 naming
the parameter), `usage.services.usage_of`. Staff see everyone's usage, anyone
else only the usage of the experiments they created.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from django.urls import URLPattern, path
from rest_framework.request import Request
from rest_framework.response import Response

from usage import services
from usage.services import Usage, UsageRow
from xmc.api.rest import BearerView
from xmc.auth.drf import IdentityUser


def _time(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _figures(row: UsageRow) -> dict[str, Any]:
    return {"gpuHours": round(row.gpu_hours, 6), "gpuHoursUsed": round(row.gpu_hours_used, 6),
            "cpuHours": round(row.cpu_hours, 6), "executions": row.executions}


def row_json(group_by: str, row: UsageRow) -> dict[str, Any]:
    key: dict[str, Any] = {"key": row.key}
    if group_by == "experiment":
        key["experiment"] = f"experiments/{row.key}"
    else:
        key[group_by] = row.key
    return {**key, **_figures(row)}


def usage_json(result: Usage, page_size: int) -> dict[str, Any]:
    return {
        "groupBy": result.group_by,
        "startTime": _time(result.period.start),
        "endTime": _time(result.period.end),
        "rows": [row_json(result.group_by, row) for row in result.rows],
        "total": _figures(result.total),
        "totalSize": result.groups,
        "nextPageToken": services.next_page_token(result, page_size),
    }


class UsageView(BearerView):
    http_method_names = ["get"]

    def get(self, request: Request) -> Response:
        user = request.user
        assert isinstance(user, IdentityUser)
        query = services.parse_query(dict(request.query_params.lists()))
        return Response(usage_json(services.usage_of(user.identity, query), query.page_size))


def openapi_paths() -> dict[str, Any]:
    """This endpoint in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    figures = {"gpuHours": {"type": "number"}, "gpuHoursUsed": {"type": "number"}, "cpuHours": {"type": "number"},
               "executions": {"type": "integer"}}
    row = {"type": "object", "properties": {"key": {"type": "string"}, "owner": {"type": "string"},
                                            "experiment": {"type": "string"}, "queue": {"type": "string"},
                                            **figures}}

    def param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}

    return {"/v1/usage": {"get": {
        "operationId": "GetUsage",
        "x-path-template": "/v1/usage",
        "x-not-an-rpc": True,
        "tags": ["usage"],
        "summary": "GPU- and CPU-hours of running executions, rolled up by owner, experiment or queue",
        "description": (
            "Running intervals (RUNNING or PARTIALLY_FAILED, from the state history) clipped to the period and "
            "weighted by the executable's allocation; gpuHoursUsed also by the mean system/gpu_utilization. "
            "Staff see everyone's usage, anyone else their own. See docs/architecture/usage.md."),
        "parameters": [
            param("groupBy", {"type": "string", "enum": list(services.GROUP_BY)}, "default owner"),
            param("startTime", {"type": "string", "format": "date-time"}, "RFC 3339; default endTime - 7 days"),
            param("endTime", {"type": "string", "format": "date-time"}, "RFC 3339; default now"),
            param("pageSize", {"type": "integer", "minimum": 1, "maximum": services.MAX_PAGE_SIZE},
                  f"rows per page, default {services.DEFAULT_PAGE_SIZE}"),
            param("pageToken", {"type": "string"}, "nextPageToken of the previous page"),
        ],
        "responses": {
            "200": {"description": "the usage", "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "groupBy": {"type": "string"}, "startTime": {"type": "string", "format": "date-time"},
                    "endTime": {"type": "string", "format": "date-time"},
                    "rows": {"type": "array", "items": row},
                    "total": {"type": "object", "properties": figures},
                    "totalSize": {"type": "integer"}, "nextPageToken": {"type": "string"}}}}}},
            "400": error, "401": error, "429": error,
        },
    }}}


urlpatterns: list[URLPattern] = [path("v1/usage", UsageView.as_view(), name="rest-usage")]
