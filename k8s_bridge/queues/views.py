"""``GET /v1/queues`` and ``GET /v1/queues/{clusterQueue}/pendingWorkloads``: Kueue's queues, joined to experiments.

Mounted through `xmc.api.extensions` by ``K8sBridgeConfig.ready`` (it reads the
cluster, so it lives on this floor, like the logs endpoint). Thin: bearer
authentication and rate limit (`xmc.api.rest.BearerView`), the query checked
by `k8s_bridge.queues.service.parse_pending_query`, the cluster read by
`k8s_bridge.queues.service`. docs/architecture/queues.md.

Every signed-in caller sees the queues (their quota and counts are the
cluster's, as ``kubectl get clusterqueues`` shows them); a pending workload
names its experiment, work unit and owner only to a caller who may read that
experiment (staff: all).
"""
from __future__ import annotations

from typing import Any

from django.urls import URLPattern, path, re_path
from rest_framework.request import Request
from rest_framework.response import Response

from core.errors import InvalidArgument
from k8s_bridge.queues import service
from k8s_bridge.queues.service import ClusterQueue, Pending
from xmc.api.rest import BearerView
from xmc.auth.drf import IdentityUser


def cluster_queue_json(cq: ClusterQueue) -> dict[str, Any]:
    return {
        "name": cq.name, "cohort": cq.cohort, "queueingStrategy": cq.strategy, "active": cq.active,
        "resources": [{"flavor": q.flavor, "resource": q.resource, "nominalQuota": q.nominal,
                       "borrowingLimit": q.borrowing_limit, "lendingLimit": q.lending_limit,
                       "usage": q.usage, "borrowed": q.borrowed} for q in cq.quotas],
        "pendingWorkloads": cq.pending, "reservingWorkloads": cq.reserving, "admittedWorkloads": cq.admitted,
        "localQueues": [{"namespace": lq.namespace, "name": lq.name, "pendingWorkloads": lq.pending,
                         "reservingWorkloads": lq.reserving, "admittedWorkloads": lq.admitted,
                         "usage": [{"flavor": f, "resource": r, "total": t} for f, r, t in lq.usage]}
                        for lq in cq.local_queues],
    }


def pending_json(p: Pending) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": p.name, "namespace": p.namespace, "localQueue": p.local_queue, "priority": p.priority,
        "creationTimestamp": p.created, "positionInClusterQueue": p.position_in_cluster_queue,
        "positionInLocalQueue": p.position_in_local_queue,
        "estimatedStart": ({"minSeconds": round(p.estimate[0]), "maxSeconds": round(p.estimate[1])}
                           if p.estimate else "unknown"),
    }
    if p.xid is not None:
        out.update({"experiment": f"experiments/{p.xid}", "workUnit": f"experiments/{p.xid}/workUnits/{p.wid}",
                    "execution": f"experiments/{p.xid}/workUnits/{p.wid}/executions/{p.eid}",
                    "owner": p.owner, "title": p.title})
    return out


class QueuesView(BearerView):
    http_method_names = ["get"]

    def get(self, request: Request) -> Response:
        for name in request.query_params:
            raise InvalidArgument(f"unknown parameter {name[:64]!r}; GET /v1/queues takes none", field=name)
        return Response({"clusterQueues": [cluster_queue_json(cq) for cq in service.cluster_queues()]})


class PendingView(BearerView):
    http_method_names = ["get"]

    def get(self, request: Request, cq: str) -> Response:
        user = request.user
        assert isinstance(user, IdentityUser)
        query = service.parse_pending_query(cq, dict(request.query_params.lists()))
        items = service.pending(user.identity, query)
        following = query.offset + len(items)
        return Response({"clusterQueue": cq, "pendingWorkloads": [pending_json(p) for p in items],
                         "nextPageToken": str(following) if len(items) == query.limit else ""})


def openapi_paths() -> dict[str, Any]:
    """These endpoints in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}

    def param(name: str, where: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
        return {"name": name, "in": where, "required": where == "path", "schema": schema, "description": description}

    ok = {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}
    return {
        "/v1/queues": {"get": {
            "operationId": "ListQueues", "x-path-template": "/v1/queues", "x-not-an-rpc": True, "tags": ["queues"],
            "summary": "Every Kueue ClusterQueue: nominal quota per flavor and resource, usage, borrowing, "
                       "pending and admitted workloads, and its LocalQueues",
            "description": "Read from the cluster's kueue.x-k8s.io objects. See docs/architecture/queues.md.",
            "parameters": [],
            "responses": {"200": ok, "400": error, "401": error, "429": error, "503": error},
        }},
        "/v1/queues/{clusterQueue}/pendingWorkloads": {"get": {
            "operationId": "ListPendingWorkloads", "x-path-template": "/v1/queues/{clusterQueue}/pendingWorkloads",
            "x-not-an-rpc": True, "tags": ["queues"],
            "summary": "A ClusterQueue's (or one LocalQueue's) pending workloads in Kueue's order, joined to their "
                       "experiment, work unit and owner, with an estimated start",
            "description": ("From Kueue's visibility API (visibility.kueue.x-k8s.io/v1beta1 pendingworkloads). "
                            "estimatedStart is `unknown` when the queue's recent admissions do not justify one. "
                            "See docs/architecture/queues.md."),
            "parameters": [
                param("clusterQueue", "path", {"type": "string"}, "the ClusterQueue"),
                param("localQueue", "query", {"type": "string"}, "`<namespace>/<name>`: only that LocalQueue's"),
                param("pageSize", "query", {"type": "integer", "minimum": 1, "maximum": service.MAX_PAGE},
                      f"default {service.DEFAULT_PAGE}"),
                param("pageToken", "query", {"type": "string"}, "nextPageToken of the previous page"),
            ],
            "responses": {"200": ok, "400": error, "401": error, "404": error, "429": error, "503": error},
        }},
    }


urlpatterns: list[URLPattern] = [
    path("v1/queues", QueuesView.as_view(), name="rest-queues"),
    re_path(r"^v1/queues/(?P<cq>[^/]{1,300})/pendingWorkloads$", PendingView.as_view(), name="rest-pending-workloads"),
]
