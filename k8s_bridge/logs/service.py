"""An execution's container logs: live from the cluster while its pods exist, else from the archive.

Who calls it: the REST view `k8s_bridge.logs.views` (after its permission check).
`open_logs` decides, before the first byte, where the lines come from and
returns a `LogStream`: what was chosen (replica, pod, container, source) and
an iterator of `LogLine` (with ``follow`` it yields lines as the container
writes them, until it stops).

Choosing, in order: the replica asked for (default: the first, in the
JobSet's order); among live pods its newest pod, else its newest archived
instance; the container asked for (default: the pod's first); the current
instance, or with ``previous`` the one before it. Filters: ``since`` first,
then ``tail_lines`` (the last N of what remains).
"""
from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from k8s_bridge import client
from k8s_bridge.logs import archive
from k8s_bridge.logs import pods as podlogs
from k8s_bridge.models import PodLogArchive
from core.errors import FailedPrecondition, InvalidArgument, NotFound, ServiceError

log = logging.getLogger(__name__)

ALL_REPLICAS = "all"
#: lines one request may return from the archive or a non-follow read (a page asks for less)
MAX_LINES = 200_000


class Unavailable(ServiceError):
    code = "UNAVAILABLE"


@dataclass(frozen=True)
class LogQuery:
    replica: str | None = None
    container: str | None = None
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    since: datetime | None = None


@dataclass(frozen=True)
class LogLine:
    replica: str
    pod: str
    container: str
    timestamp: str
    text: str
    source: str


@dataclass
class LogStream:
    source: str  # "cluster" | "archive" | "none"
    replicas: list[str]
    replica: str
    pod: str
    container: str
    containers: list[str]
    lines: Iterator[LogLine]
    namespace: str
    archived_at: datetime | None = None
    truncated: bool = False
    note: str = ""
    console_url: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    #: no container of the replica has started yet (no pod, or its container waiting to start): a
    #: follower asks again rather than ending
    waiting: bool = False


def _ts(stamp: str) -> str:
    """The kubelet's RFC 3339 (nanoseconds, zeros trimmed) as fixed-width microseconds: sortable as text."""
    when = podlogs.parse_time(stamp) if stamp else None
    return podlogs.format_time(when) if when is not None else ""


def console_url(namespace: str, pod: str, container: str, xid: int, wid: int, eid: int) -> str:
    template = str(settings.XMC_LOGS_CONSOLE_URL_TEMPLATE)
    if not template or not pod:
        return ""
    values = {"namespace": namespace, "pod": pod, "container": container, "xid": str(xid), "wid": str(wid),
              "eid": str(eid)}
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", value)
    return out


def _filter(lines: Iterator[podlogs.RawLine], since: datetime | None) -> Iterator[podlogs.RawLine]:
    for line in lines:
        if since is not None:
            when = podlogs.parse_time(line.timestamp)
            if when is not None and when < since:
                continue
        yield line


def _tail(lines: Iterator[podlogs.RawLine], tail: int | None) -> Iterator[podlogs.RawLine]:
    """The last ``tail`` lines (held in memory), or every line as it comes (at most `MAX_LINES`)."""
    if tail is None:
        return itertools.islice(lines, MAX_LINES)
    if tail == 0:
        return iter(())
    return iter(deque(lines, maxlen=min(tail, MAX_LINES)))


def _archived_rows(xid: int, wid: int, eid: int) -> list[PodLogArchive]:
    return list(PodLogArchive.objects.filter(xid=xid, wid=wid, eid=eid, status=PodLogArchive.Status.ARCHIVED)
                .order_by("id"))


def open_logs(xid: int, wid: int, eid: int, namespace: str, query: LogQuery) -> LogStream:
    """See the module docstring. Raises NotFound (replica/container), InvalidArgument, Unavailable."""
    try:
        jobset = podlogs.execution_jobset(namespace, xid, wid, eid)
        live = podlogs.jobset_pods(jobset) if jobset is not None else []
    except client.ApiException as exc:
        raise Unavailable(f"the cluster did not answer: {exc.status} {exc.reason}") from None
    except Exception as exc:  # noqa: BLE001 - unreachable, no credentials, ...: 503, never 500
        log.warning("logs.cluster_unreachable", extra={"error": repr(exc)[:300]})
        raise Unavailable(f"the cluster is unreachable from this server: {type(exc).__name__}") from None
    rows = _archived_rows(xid, wid, eid)
    replicas = sorted({p.replica for p in live} | {r.replica for r in rows}, key=podlogs._replica_sort_key)
    if query.replica == ALL_REPLICAS:
        return _all_replicas(xid, wid, eid, namespace, query, live, rows, replicas)
    if not replicas:
        return LogStream("none", [], "", "", "", [], iter(()), namespace,
                         note="no pod of this execution has started yet, and nothing is archived", waiting=True)
    replica = query.replica or replicas[0]
    if replica not in replicas:
        raise NotFound(f"replica {replica!r} not found; this execution has {', '.join(replicas)}", field="replica")
    pod = next((p for p in live if p.replica == replica), None)
    if pod is not None:
        stream = _live(xid, wid, eid, pod, query, rows)
        if stream is not None:
            stream.replicas = replicas
            return stream
    stream = _archived(xid, wid, eid, namespace, replica, query, rows)
    stream.replicas = replicas
    return stream


def _container(query: LogQuery, containers: Sequence[str]) -> str:
    if query.container is None:
        return containers[0] if containers else "main"
    if query.container not in containers:
        raise NotFound(f"container {query.container!r} not found; the replica has {', '.join(containers)}",
                       field="container")
    return query.container


def _live(xid: int, wid: int, eid: int, pod: podlogs.PodRef, query: LogQuery,
          rows: Sequence[PodLogArchive]) -> LogStream | None:
    """Read the pod's log; None when the pod is gone (the caller turns to the archive)."""
    container = _container(query, list(pod.containers))
    try:
        # The tail is applied here after `since`; ask the server for it only without `since`, or
        # when following (an open stream cannot be tailed after `since`: the kubelet's order then).
        server_tail = query.tail_lines if (query.since is None or query.follow) else None
        raw = podlogs.read_lines(pod, container, previous=query.previous, follow=query.follow,
                                 tail_lines=server_tail)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        if exc.status == 400:
            message = _status_message(exc)
            if query.previous and "previous terminated container" in message:
                archived = [r for r in rows if r.pod_uid == pod.uid and r.container == container]
                if archived:
                    return None
                raise FailedPrecondition(f"{pod.replica}: {message}", field="previous") from None
            # Waiting to start: the pod cannot serve this execution's log. When the archive holds
            # the replica's log -- the pod was restored (a restarted cluster, its containers not
            # started in this cluster life) or stands in again for one that ran -- the archive wins.
            if any(r.replica == pod.replica for r in rows):
                return None
            # Otherwise (image pull, creating) there is nothing to read yet, and that is the answer.
            return LogStream("cluster", [], pod.replica, pod.name, container, list(pod.containers), iter(()),
                             pod.namespace, note=message, waiting=True,
                             console_url=console_url(pod.namespace, pod.name, container, xid, wid, eid))
        raise Unavailable(f"the cluster did not answer: {exc.status} {exc.reason}") from None
    except Exception as exc:  # noqa: BLE001 - unreachable: 503, never 500
        log.warning("logs.cluster_unreachable", extra={"error": repr(exc)[:300]})
        raise Unavailable(f"the cluster is unreachable from this server: {type(exc).__name__}") from None
    filtered = _filter(raw, query.since)

    def lines() -> Iterator[LogLine]:
        source: Iterator[podlogs.RawLine] = filtered if query.follow else _tail(filtered, query.tail_lines)
        try:
            for line in source:
                yield LogLine(pod.replica, pod.name, container, _ts(line.timestamp), line.text, "cluster")
        except (OSError, client.ApiException) as exc:
            # The API server closed the stream mid-way (pod deleted, restart): what was sent stands.
            log.info("logs.stream_ended", extra={"pod": pod.name, "container": container, "error": repr(exc)[:200]})
        except Exception as exc:  # noqa: BLE001 - urllib3's ProtocolError and friends: same
            log.info("logs.stream_ended", extra={"pod": pod.name, "container": container, "error": repr(exc)[:200]})
        finally:
            close = getattr(raw, "close", None)
            if close is not None:
                close()

    return LogStream("cluster", [], pod.replica, pod.name, container, list(pod.containers), lines(), pod.namespace,
                     console_url=console_url(pod.namespace, pod.name, container, xid, wid, eid))


def _status_message(exc: client.ApiException) -> str:
    import json

    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.body or exc.reason)


def _archived(xid: int, wid: int, eid: int, namespace: str, replica: str, query: LogQuery,
              rows: Sequence[PodLogArchive]) -> LogStream:
    mine = [r for r in rows if r.replica == replica]
    if not mine:
        # The pod went between the listing and the read, and nothing of it is archived (yet).
        return LogStream("none", [], replica, "", query.container or "", [], iter(()), namespace,
                         note="the pod is gone and its log is not archived (yet)")
    newest_pod = max(mine, key=lambda r: r.id).pod_uid
    of_pod = [r for r in mine if r.pod_uid == newest_pod]
    containers = list(dict.fromkeys(r.container for r in sorted(of_pod, key=lambda r: r.id)))
    container = _container(query, containers)
    instances = sorted((r for r in of_pod if r.container == container), key=lambda r: r.attempt)
    if query.previous:
        if len(instances) < 2:
            raise FailedPrecondition(f'{replica}: no previous instance of container "{container}" was archived',
                                     field="previous")
        row = instances[-2]
    else:
        row = instances[-1]
    try:
        lines_all = archive.read_archived(row)
    except Exception as exc:  # noqa: BLE001 - the store is down: say so, never 500
        raise Unavailable(f"the log archive did not answer: {exc!r}") from None
    chosen = list(_tail(_filter(iter(lines_all), query.since), query.tail_lines))
    url = console_url(row.namespace, row.pod_name, container, xid, wid, eid)
    return LogStream(
        "archive", [], replica, row.pod_name, container, containers,
        iter([LogLine(replica, row.pod_name, container, _ts(ln.timestamp), ln.text, "archive") for ln in chosen]),
        namespace, archived_at=row.archived_at, truncated=row.truncated, console_url=url,
        note="the pod is gone; this log was archived" + (" (snapshot taken before the pod was deleted)"
                                                          if not row.finished else ""),
    )


def _all_replicas(xid: int, wid: int, eid: int, namespace: str, query: LogQuery, live: Sequence[podlogs.PodRef],
                  rows: Sequence[PodLogArchive], replicas: Sequence[str]) -> LogStream:
    """Every replica's log (the container asked for, else each pod's first) interleaved by time."""
    if query.follow:
        raise InvalidArgument("follow needs one replica (replica=all reads what is there)", field="follow")
    streams: list[list[LogLine]] = []
    sources: set[str] = set()
    skipped: list[str] = []
    for replica in replicas:
        sub = LogQuery(replica=replica, container=query.container, previous=query.previous,
                       tail_lines=query.tail_lines, since=query.since)
        pod = next((p for p in live if p.replica == replica), None)
        try:
            got = _live(xid, wid, eid, pod, sub, rows) if pod is not None else None
            if got is None:
                if not any(r.replica == replica for r in rows):
                    continue
                got = _archived(xid, wid, eid, namespace, replica, sub, rows)
        except (NotFound, FailedPrecondition) as exc:
            skipped.append(str(exc))
            continue  # this replica has no such container / instance
        sources.add(got.source)
        streams.append(list(got.lines))
    merged = heapq.merge(*streams, key=lambda ln: (ln.timestamp, ln.replica))
    source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")
    # With nothing to serve, the answer says why (e.g. no replica has a previous instance).
    note = "; ".join(skipped)[:400] if not streams else ""
    return LogStream(source, list(replicas), ALL_REPLICAS, "", query.container or "", [], iter(merged), namespace,
                     note=note)
