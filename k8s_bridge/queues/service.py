"""The cluster's Kueue queues, read through the Kubernetes API and joined to experiments (docs/architecture/queues.md).

* `cluster_queues`: every ClusterQueue (``kueue.x-k8s.io`` ``clusterqueues``)
  with its nominal quota per flavor and resource (``spec.resourceGroups``),
  its usage and borrowing (``status.flavorsReservation``, the quota its
  admitted workloads hold, and ``borrowed``), its pending / reserving /
  admitted counts, and its LocalQueues (``localqueues``, their own counts and
  usage). Two list calls, whatever the number of workloads.
* `pending`: one page of a queue's pending workloads from Kueue's visibility
  API (``visibility.kueue.x-k8s.io/v1beta1 .../pendingworkloads``, ``offset`` /
  ``limit``), each joined to its work unit through the JobSet that owns it:
  XMC names every JobSet ``xmc-<xid>-<wid>`` (`jobsets.contract.jobset_name`)
  and Kueue names that owner in the workload's ``ownerReferences``. The work
  unit gives the current execution, the experiment and its owner; a workload
  of an experiment the caller may not read keeps its queue facts and loses
  the rest. Each gets the estimated start of `workunits.eta` (while it is shown).

Only `k8s_bridge.client` touches the SDK.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from core import inputs
from core.errors import InvalidArgument, NotFound
from core.identity import Identity
from experiments import acl
from k8s_bridge import client
from k8s_bridge.logs.service import Unavailable
from workunits import eta
from workunits.models import WorkUnit

CLUSTER_QUEUES = "clusterqueues"
LOCAL_QUEUES = "localqueues"
_JOBSET_NAME = re.compile(r"^xmc-([0-9]{1,19})-([0-9]{1,19})$")
#: Pending workloads one page holds at most / by default.
MAX_PAGE = 1000
DEFAULT_PAGE = 50


@dataclass(frozen=True)
class Quota:
    """One resource of one flavor of a ClusterQueue (quantities as Kubernetes writes them)."""

    flavor: str
    resource: str
    nominal: str
    borrowing_limit: str | None
    lending_limit: str | None
    usage: str
    borrowed: str


@dataclass(frozen=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    pending: int
    reserving: int
    admitted: int
    usage: list[tuple[str, str, str]]  # (flavor, resource, total)


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    cohort: str
    strategy: str
    active: bool
    quotas: list[Quota]
    pending: int
    reserving: int
    admitted: int
    local_queues: list[LocalQueue] = field(default_factory=list)


@dataclass(frozen=True)
class Pending:
    """One pending workload and, when the caller may read it, the work unit it stands for."""

    name: str
    namespace: str
    local_queue: str
    priority: int
    created: str
    position_in_cluster_queue: int
    position_in_local_queue: int
    xid: int | None = None
    wid: int | None = None
    eid: int | None = None
    owner: str = ""
    title: str = ""
    #: Seconds from now (low, high) until it is admitted; None: unknown.
    estimate: tuple[float, float] | None = None


def _api_error(exc: Exception, what: str) -> Exception:
    status = getattr(exc, "status", None)
    if status == 404:
        return NotFound(f"{what} not found", field="name")
    return Unavailable(f"the cluster did not answer for {what}: {getattr(exc, 'reason', None) or exc}")


def _list(plural: str) -> list[dict[str, Any]]:
    try:
        body = client.custom_objects().list_cluster_custom_object(
            client.KUEUE_GROUP, client.KUEUE_VERSION, plural, _request_timeout=10)
    except client.ApiException as exc:
        raise _api_error(exc, plural) from None
    except Exception as exc:  # no kubeconfig, no route, a timeout: the cluster did not answer
        raise Unavailable(f"the cluster did not answer for {plural}: {type(exc).__name__}") from None
    return list(body.get("items") or [])


def _quotas(cq: Mapping[str, Any]) -> list[Quota]:
    status = cq.get("status") or {}
    used: dict[tuple[str, str], tuple[str, str]] = {}
    for flavor in status.get("flavorsReservation") or status.get("flavorsUsage") or []:
        for res in flavor.get("resources") or []:
            used[(str(flavor.get("name")), str(res.get("name")))] = (str(res.get("total") or "0"),
                                                                     str(res.get("borrowed") or "0"))
    out: list[Quota] = []
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                key = (str(flavor.get("name")), str(res.get("name")))
                total, borrowed = used.get(key, ("0", "0"))
                out.append(Quota(key[0], key[1], str(res.get("nominalQuota") or "0"),
                                 None if res.get("borrowingLimit") is None else str(res["borrowingLimit"]),
                                 None if res.get("lendingLimit") is None else str(res["lendingLimit"]),
                                 total, borrowed))
    return out


def _active(obj: Mapping[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def cluster_queues() -> list[ClusterQueue]:
    """Every ClusterQueue with its quota, usage and LocalQueues, by name."""
    local: dict[str, list[LocalQueue]] = {}
    for lq in _list(LOCAL_QUEUES):
        md, spec, st = lq.get("metadata") or {}, lq.get("spec") or {}, lq.get("status") or {}
        usage = [(str(f.get("name")), str(r.get("name")), str(r.get("total") or "0"))
                 for f in st.get("flavorsReservation") or st.get("flavorsUsage") or [] for r in f.get("resources") or []]
        queue = LocalQueue(str(md.get("namespace") or ""), str(md.get("name") or ""), str(spec.get("clusterQueue") or ""),
                           int(st.get("pendingWorkloads") or 0), int(st.get("reservingWorkloads") or 0),
                           int(st.get("admittedWorkloads") or 0), usage)
        local.setdefault(queue.cluster_queue, []).append(queue)
    out = []
    for cq in _list(CLUSTER_QUEUES):
        md, spec, st = cq.get("metadata") or {}, cq.get("spec") or {}, cq.get("status") or {}
        name = str(md.get("name") or "")
        cohort = spec.get("cohort") or spec.get("cohortName") or ""
        out.append(ClusterQueue(
            name, str(cohort), str(spec.get("queueingStrategy") or "BestEffortFIFO"), _active(cq), _quotas(cq),
            int(st.get("pendingWorkloads") or 0), int(st.get("reservingWorkloads") or 0),
            int(st.get("admittedWorkloads") or 0),
            sorted(local.get(name, []), key=lambda q: (q.namespace, q.name))))
    return sorted(out, key=lambda q: q.name)


@dataclass(frozen=True)
class PendingQuery:
    cluster_queue: str
    local_queue: tuple[str, str] | None  # (namespace, name)
    offset: int
    limit: int


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def parse_pending_query(cluster_queue: str, params: Mapping[str, Sequence[str]]) -> PendingQuery:
    """``localQueue`` (``namespace/name``), ``pageSize``, ``pageToken``; anything else is a 400 naming it."""
    allowed = ("localQueue", "pageSize", "pageToken")
    for name, values in params.items():
        if name not in allowed:
            raise InvalidArgument(f"unknown parameter {name[:64]!r}; allowed: {', '.join(allowed)}", field=name)
        if len(values) > 1:
            raise InvalidArgument(f"{name} may be given once", field=name)
    if not _NAME.fullmatch(cluster_queue):
        raise InvalidArgument(f"{cluster_queue[:64]!r} is not a ClusterQueue name", field="clusterQueue")
    one = {name: (values[0] if values else "") for name, values in params.items()}
    local: tuple[str, str] | None = None
    if one.get("localQueue"):
        namespace, _, lq = one["localQueue"].partition("/")
        if not (_NAME.fullmatch(namespace) and _NAME.fullmatch(lq)):
            raise InvalidArgument("localQueue must be <namespace>/<name>", field="localQueue")
        local = (namespace, lq)
    limit = inputs.parse_int(one["pageSize"], "pageSize", low=1, high=MAX_PAGE) if one.get("pageSize") else DEFAULT_PAGE
    offset = inputs.parse_int(one["pageToken"], "pageToken", low=0, high=10**7) if one.get("pageToken") else 0
    return PendingQuery(cluster_queue, local, offset, limit)


def _visibility(query: PendingQuery) -> list[dict[str, Any]]:
    params = [("offset", str(query.offset)), ("limit", str(query.limit))]
    try:
        if query.local_queue is not None:
            body = client.get_json(client.VISIBILITY_LQ_PATH,
                                   {"namespace": query.local_queue[0], "lq": query.local_queue[1]}, params)
        else:
            body = client.get_json(client.VISIBILITY_PATH, {"cq": query.cluster_queue}, params)
    except client.ApiException as exc:
        raise _api_error(exc, f"the pending workloads of {query.cluster_queue}") from None
    except Exception as exc:  # no kubeconfig, no route, a timeout: the cluster did not answer
        raise Unavailable(f"the cluster did not answer for the pending workloads: {type(exc).__name__}") from None
    return list(body.get("items") or [])


def _owner_key(item: Mapping[str, Any]) -> tuple[int, int] | None:
    for ref in (item.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "JobSet":
            match = _JOBSET_NAME.fullmatch(str(ref.get("name") or ""))
            if match:
                return int(match.group(1)), int(match.group(2))
    return None


def _work_units(identity: Identity, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], dict[str, Any]]:
    """(xid, wid) -> its current eid, queue, experiment title and owner: those the caller may read."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    condition = Q()
    for xid, wid in wanted:
        condition |= Q(experiment_id=xid, wid=wid)
    rows = (WorkUnit.objects.filter(condition).filter(acl.readable_q(identity, "experiment__"))
            .values("experiment_id", "wid", "current_eid", "experiment__title", "experiment__creator",
                    "executable__schedulingConstraints__queueName"))
    return {(r["experiment_id"], r["wid"]): dict(r) for r in rows}


def pending(identity: Identity, query: PendingQuery, *, now: datetime | None = None) -> list[Pending]:
    """One page of a queue's pending workloads, in Kueue's order, joined to what the caller may read."""
    items = _visibility(query)
    keys = [_owner_key(item) for item in items]
    units = _work_units(identity, (k for k in keys if k is not None))
    queues = {str(i.get("localQueueName") or "") for i in items}
    # Only while the method clears its bar (workunits.eta.shown): else every start is "unknown".
    admissions = eta.recent_admissions(sorted(queues), eta.ESTIMATE_WINDOW_S) if queues and eta.shown() else {}
    now = now or timezone.now()
    out = []
    for n, item in enumerate(items):
        md = item.get("metadata") or {}
        lq = str(item.get("localQueueName") or "")
        position = int(item.get("positionInLocalQueue") or 0)
        key = keys[n]
        unit = units.get(key) if key is not None else None
        pend = Pending(
            str(md.get("name") or ""), str(md.get("namespace") or ""), lq, int(item.get("priority") or 0),
            str(md.get("creationTimestamp") or ""), int(item.get("positionInClusterQueue") or 0), position,
            estimate=eta.estimate_start(position + 1, admissions.get(lq, []), now))
        if unit is not None:
            pend = Pending(**{**pend.__dict__, "xid": unit["experiment_id"], "wid": unit["wid"],
                              "eid": unit["current_eid"], "owner": unit["experiment__creator"],
                              "title": unit["experiment__title"]})
        out.append(pend)
    return out
