"""``/queues``: the cluster's Kueue queues and one queue's pending workloads (`k8s_bridge.queues.service`).

Server-rendered like the other pages; the same reads as ``GET /v1/queues`` and
``GET /v1/queues/{cq}/pendingWorkloads`` (docs/architecture/queues.md): every
ClusterQueue with its quota, usage and borrowing per flavor and resource and
its LocalQueues, then one page of the chosen queue's pending workloads (``cq``,
default the first with any; ``page``), each with its work unit and owner when
the caller may read the experiment, and the estimated start.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from core.errors import InvalidArgument, NotFound, ServiceError
from core.identity import Identity
from k8s_bridge.queues import service
from ui import present
from ui.views import signed_in

PAGE = 50


@require_GET
@signed_in
def queues_page(request: HttpRequest, identity: Identity) -> HttpResponse:
    error = ""
    queues: list[service.ClusterQueue] = []
    pending: list[dict[str, Any]] = []
    chosen = str(request.GET.get("cq", ""))[:253]
    next_url = first_url = ""
    try:
        queues = service.cluster_queues()
        if not chosen:
            chosen = next((q.name for q in queues if q.pending), queues[0].name if queues else "")
        if chosen:
            params = {"pageSize": [str(PAGE)]}
            if request.GET.get("page"):
                params["pageToken"] = [str(request.GET["page"])[:12]]
            query = service.parse_pending_query(chosen, params)
            for p in service.pending(identity, query):
                pending.append({"p": p, "estimate": _estimate(p)})
            if len(pending) == PAGE:
                next_url = "?" + urlencode({"cq": chosen, "page": query.offset + PAGE})
            if query.offset:
                first_url = "?" + urlencode({"cq": chosen})
    except (InvalidArgument, NotFound) as exc:
        error = str(exc)
    except ServiceError as exc:  # the cluster did not answer: say so, on the page
        error = str(exc)
    total = next((q.pending for q in queues if q.name == chosen), 0)
    return render(request, "ui/queues.html", {
        "queues": queues, "chosen": chosen, "pending": pending, "error": error, "total": total,
        "next_url": next_url, "first_url": first_url, "me": identity.email,
    })


def _estimate(p: service.Pending) -> str:
    if p.estimate is None:
        return "unknown"
    words = present.estimate_words(p.estimate, 0)
    return words.removeprefix("Estimated start ").split(" (from")[0]
