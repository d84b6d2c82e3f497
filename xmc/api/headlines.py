"""``GET /v1/experiments/{xid}/headlines``: each work unit's state and one-line why, as the server reads it.

The headline is computed once, on the server (``workunits.headline``): the
pages show it and ``xmc status`` / ``xmc why`` print it rather than reading
the messages themselves. Thin: authenticate (bearer), the reader check of
the API (``xmc.api.reads``: PERMISSION_DENIED as for GetExperiment), one
query. Answer: ``{"headlines": [{"name", "executionId", "state", "headline",
"sentence", "reason"}]}``: ``sentence`` is the line the pages show and ``xmc``
prints as is, ``reason`` the structured case (``{"code": "WAITING_FOR_QUOTA",
"queue", "positionInQueue", "totalInQueue"}``, ``{"code": "FAILED", "cause":
"EXIT_CODE", "exitCode", "failures", "retryLimit"}``, ...; `workunits.headline.explain`).
Mounted by ``xmc.api.rest_urls``; in the OpenAPI document by `openapi_paths`.
"""
from __future__ import annotations

from typing import Any

from django.urls import URLPattern, path
from rest_framework.request import Request
from rest_framework.response import Response

from core import names
from experiments.acl import Role
from workunits import headline
from xmc.api import reads
from xmc.api.rest import BearerView
from xmc.auth.drf import IdentityUser


class HeadlinesView(BearerView):
    http_method_names = ["get"]

    def get(self, request: Request, xid: int) -> Response:
        user = request.user
        assert isinstance(user, IdentityUser)
        reads.require_experiment_role(int(xid), user.identity, Role.READER)
        return Response({"headlines": headline.for_experiment(int(xid))})


names.register_converters()  # <id:...>: ids spelled once (core.names.IdConverter)
urlpatterns: list[URLPattern] = [
    path("v1/experiments/<id:xid>/headlines", HeadlinesView.as_view(), name="rest-headlines"),
]


def openapi_paths() -> dict[str, Any]:
    """This endpoint in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    text = {"type": "string"}
    reason = {"type": "object", "required": ["code"], "description": (
        "The structured case the sentence words (workunits.headline.explain): `code` is WAITING_FOR_QUOTA, "
        "PREEMPTED, EVICTED, SCHEDULING_PAUSED, FAILED, PARTIALLY_FAILED, ERROR, CRASH_LOOPING, WARNING, "
        "HANDING_TO_CLUSTER, RESTARTING, STARTING, or the state itself (RUNNING, COMPLETED, ...); a failure's "
        "`cause` is EXIT_CODE, SIGNAL, OUT_OF_MEMORY, COULD_NOT_START, CLUSTER_REFUSED, NODE_LOST, "
        "DELETED_OUTSIDE_XMC, RETRIES_EXHAUSTED, OTHER or UNKNOWN"), "properties": {
        "code": text, "cause": text, "queue": text, "positionInQueue": {"type": "integer"},
        "totalInQueue": {"type": "integer"}, "exitCode": {"type": "integer"}, "signal": text,
        "failures": {"type": "integer"}, "retryLimit": {"type": "integer"}, "restarts": {"type": "integer"},
        "replica": text, "detail": text}}
    row = {"type": "object", "properties": {
        "name": text, "executionId": {"type": "integer"}, "state": text,
        "headline": {"type": "string", "description": "the one line, lower case (kept for older clients)"},
        "sentence": {"type": "string", "description": "the line the pages show and `xmc why`/`xmc status` print; "
                                                      "\"\" for a unit that runs or ended well"},
        "reason": reason}}
    return {"/v1/experiments/{xid}/headlines": {"get": {
        "operationId": "ListHeadlines",
        "x-path-template": "/v1/experiments/{xid}/headlines",
        "x-not-an-rpc": True,
        "tags": ["experiments"],
        "summary": "Why each work unit of the experiment is not running (or why it failed), as the pages say it",
        "parameters": [
            {"name": "xid", "in": "path", "required": True, "schema": {"type": "string"}, "description": "experiment id"},
        ],
        "responses": {"200": {"description": "one row per work unit, by wid", "content": {"application/json": {
            "schema": {"type": "object", "properties": {"headlines": {"type": "array", "items": row}}}}}},
            "401": error, "403": error, "404": error, "429": error},
    }}}
