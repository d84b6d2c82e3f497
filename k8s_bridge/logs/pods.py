"""The pods of one execution and their container logs, read through `k8s_bridge.client`.

Who calls it: `k8s_bridge.logs.service` (the REST logs endpoint) and
`k8s_bridge.logs.archive` (the archiver). Everything goes through the
official client's ``read_namespaced_pod_log`` (``pods/log``), streamed with
``_preload_content=False``; nothing shells out to kubectl.

An execution's pods are those of its JobSet (``xmc-<xid>-<wid>`` whose
``xmc.google.com/execution-id`` label is the eid), found by the JobSet
controller's ``jobset.sigs.k8s.io/jobset-uid`` label. A *replica* names one
of them: ``<replicatedJob>-<jobIndex>`` (``-<podIndex>`` appended when its
Job runs several pods); among pods of the same replica (a Job's retries, a
JobSet restart) the newest wins.
"""
from __future__ import annotations

import codecs
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from k8s_bridge import client

XID_LABEL = "xmc.google.com/xid"
WID_LABEL = "xmc.google.com/wid"
EID_LABEL = "xmc.google.com/execution-id"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
POD_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

#: read timeout of one non-follow log read (seconds)
READ_TIMEOUT_S = 30.0
#: a followed log with no new line for this long ends (the reader reconnects with sinceTime)
FOLLOW_IDLE_S = 300.0


def request_timeout(seconds: float) -> tuple[float, float]:
    """The client's ``_request_timeout`` for ``seconds``: a (connect, read) pair. The generated
    client ignores a float (it takes an int or a pair): 30.0 meant no timeout at all."""
    return (seconds, seconds)


def jobset_name(xid: int, wid: int) -> str:
    return f"xmc-{xid}-{wid}"


_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})$")


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 time with up to nanoseconds (the kubelet's timestamps); None when it is not one."""
    match = _RFC3339.match(text.strip())
    if not match:
        return None
    base, frac, zone = match.groups()
    value = base + (f".{(frac + '000000')[:6]}" if frac else "") + ("+00:00" if zone == "Z" else zone)
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def format_time(when: datetime) -> str:
    """RFC 3339, UTC, microseconds (the precision every line keeps here)."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class PodRef:
    """What the log path needs of one pod."""

    namespace: str
    name: str
    uid: str
    replica: str
    containers: tuple[str, ...]
    #: container name -> its status (restartCount, state, lastState) as the API returns it
    statuses: Mapping[str, Mapping[str, Any]]
    phase: str
    node: str
    created: str
    restart_attempt: int
    deleting: bool
    raw: Mapping[str, Any]

    def restart_count(self, container: str) -> int:
        return int((self.statuses.get(container) or {}).get("restartCount") or 0)


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def replica_of(pod: Mapping[str, Any], pods_per_job: int = 1) -> str:
    labels = _labels(pod)
    base = f"{labels.get(RJOB_LABEL, 'job')}-{labels.get(JOB_INDEX_LABEL, '0')}"
    if pods_per_job > 1:
        return f"{base}-{labels.get(POD_INDEX_LABEL, '0')}"
    return base


def pod_ref(pod: Mapping[str, Any], pods_per_job: int = 1) -> PodRef:
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    containers = tuple(str(c.get("name")) for c in spec.get("containers") or [])
    statuses = {str(cs.get("name")): cs for cs in (status.get("containerStatuses") or [])}
    try:
        attempt = int(_labels(pod).get(RESTART_ATTEMPT_LABEL, "0"))
    except ValueError:
        attempt = 0
    return PodRef(
        namespace=str(md.get("namespace") or ""), name=str(md.get("name") or ""), uid=str(md.get("uid") or ""),
        replica=replica_of(pod, pods_per_job), containers=containers, statuses=statuses,
        phase=str(status.get("phase") or ""), node=str(spec.get("nodeName") or ""),
        created=str(md.get("creationTimestamp") or ""), restart_attempt=attempt,
        deleting=bool(md.get("deletionTimestamp")), raw=pod,
    )


def pods_per_job(jobset: Mapping[str, Any]) -> dict[str, int]:
    """replicatedJob name -> pods each of its Jobs runs (parallelism)."""
    out = {}
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job_spec = (rj.get("template") or {}).get("spec") or {}
        out[str(rj.get("name"))] = int(job_spec.get("parallelism") or 1)
    return out


def execution_jobset(namespace: str, xid: int, wid: int, eid: int,
                     timeout_s: float = READ_TIMEOUT_S) -> dict[str, Any] | None:
    """The JobSet of this execution, or None (gone, or it belongs to another execution)."""
    try:
        jobset = client.custom_objects().get_namespaced_custom_object(
            client.JOBSET_GROUP, client.JOBSET_VERSION, namespace, client.JOBSET_PLURAL, jobset_name(xid, wid),
            _request_timeout=request_timeout(timeout_s),
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    if str(_labels(jobset).get(EID_LABEL, "")) != str(eid):
        return None
    return jobset  # type: ignore[no-any-return]


def jobset_pods(jobset: Mapping[str, Any], timeout_s: float = READ_TIMEOUT_S) -> list[PodRef]:
    """The JobSet's pods, one per replica (the newest), sorted by replica."""
    md = jobset.get("metadata") or {}
    result = client.core().list_namespaced_pod(
        str(md.get("namespace") or ""), label_selector=f"{JOBSET_UID_LABEL}={md.get('uid')}",
        _request_timeout=request_timeout(timeout_s),
    )
    raw = client.api_client().sanitize_for_serialization(result)
    return newest_per_replica([p for p in raw.get("items") or []], pods_per_job(jobset))


def newest_per_replica(pods: Sequence[Mapping[str, Any]], per_job: Mapping[str, int]) -> list[PodRef]:
    refs = [pod_ref(p, per_job.get(str(_labels(p).get(RJOB_LABEL, "")), 1)) for p in pods]
    best: dict[str, PodRef] = {}
    for ref in refs:
        held = best.get(ref.replica)
        if held is None or (ref.restart_attempt, ref.created, ref.name) > (held.restart_attempt, held.created, held.name):
            best[ref.replica] = ref
    return [best[k] for k in sorted(best, key=_replica_sort_key)]


def _replica_sort_key(replica: str) -> tuple[Any, ...]:
    parts = replica.split("-")
    return tuple((0, int(p), "") if (p.isascii() and p.isdigit()) else (1, 0, p) for p in parts)


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawLine:
    """One line as the kubelet gave it (``timestamps=true``)."""

    timestamp: str  # RFC 3339 as sent
    text: str


def split_timestamp(line: str) -> RawLine:
    stamp, sep, text = line.partition(" ")
    if sep and parse_time(stamp) is not None:
        return RawLine(stamp, text)
    return RawLine("", line)


def read_lines(ref: PodRef, container: str, *, previous: bool = False, follow: bool = False,
               tail_lines: int | None = None, limit_bytes: int | None = None,
               timeout_s: float | None = READ_TIMEOUT_S) -> Iterator[RawLine]:
    """The container's log, line by line, as the API streams it (timestamps always on).

    Raises ``client.ApiException`` (404 pod gone, 400 "waiting to start" /
    "previous terminated container ... not found") before the first line.
    With ``follow`` the iterator ends when the API server closes the stream
    (the container stopped); the caller closes it to stop early.
    """
    kwargs: dict[str, Any] = {"container": container, "timestamps": True, "follow": follow, "previous": previous,
                              "_preload_content": False}
    if tail_lines is not None:
        kwargs["tail_lines"] = tail_lines
    if limit_bytes is not None:
        kwargs["limit_bytes"] = limit_bytes
    if timeout_s is not None:
        kwargs["_request_timeout"] = request_timeout(timeout_s) if not follow else (10.0, FOLLOW_IDLE_S)
    response = client.core().read_namespaced_pod_log(ref.name, ref.namespace, **kwargs)
    return _lines(response)


def _lines(response: Any) -> Iterator[RawLine]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    try:
        for chunk in response.stream(65536, decode_content=True):
            pending += decoder.decode(chunk)
            *complete, pending = pending.split("\n")
            for line in complete:
                yield split_timestamp(line)
        pending += decoder.decode(b"", final=True)
        if pending:
            yield split_timestamp(pending)
    finally:
        response.close()
        response.release_conn()
