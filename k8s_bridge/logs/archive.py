"""The pod log archive: each terminated container instance's log, kept once, after the pods are gone.

Who calls it: the reconciler (`k8s_bridge.reconciler.controller`) hands every
pod it observes to `Archiver.observe`; the finalizer path asks
`Archiver.settled` before it lets a stopped JobSet go; the logs endpoint
(`k8s_bridge.logs.service`) reads archived text with `read_archived`.

* **What is archived.** A container instance (pod uid, container,
  restartCount) once it has terminated (``state.terminated``, or
  ``lastState.terminated`` of a restarted or crash-looping container), and a
  snapshot of every container of a pod whose JobSet or pod is being deleted.
  Only the last ``XMC_LOG_ARCHIVE_MAX_BYTES`` are kept (whole lines), with
  the kubelet's timestamps, at
  ``<XMC_LOG_ARCHIVE_URL>/<namespace>/<xid>/<wid>/<eid>/<pod>/<container>.<restartCount>.log``
  (any fsspec URL; a folder under the run directory by default).
* **Never twice.** One `k8s_bridge.models.PodLogArchive` row per instance
  (unique constraint); a row ``ARCHIVED`` is never written again, also after
  a reconciler restart (the row says so; an in-memory set spares the query).
* **Never blocking.** `Archiver.observe` only puts a key on an in-memory
  queue; one archiver thread with its own database connection reads the log
  through the official client and writes the store. The reconciler's batcher
  and its state writes never wait for it. A failure (store down, API
  timeout) is retried with backoff (1 s doubling, cap 60 s) for ever; a pod
  that is gone before its log was read is recorded ``LOST`` (nothing left to
  read).
* **Kept for** ``XMC_LOG_ARCHIVE_RETENTION_DAYS`` (0, the default: for ever).
  :func:`purge` (beat, hourly: task ``xmc.logs.purge_archive``) deletes the
  objects and rows archived (or lost) longer ago than that; an object the
  store cannot delete keeps its row for the next run.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection
from django.db.models import Q
from django.utils import timezone
from prometheus_client import Counter

from k8s_bridge import client
from k8s_bridge.logs import pods as podlogs
from k8s_bridge.models import PodLogArchive

log = logging.getLogger(__name__)

#: lines and bytes kept in the row for a failure card
TAIL_LINES = 20
TAIL_BYTES = 4096
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
LOST = PodLogArchive.Status.LOST
#: served with the reconciler's metrics (``manage.py reconcile --metrics-port``)
RESULTS = Counter("xmc_log_archive_total", "Container log archive attempts by result (archived, failed, lost, known)",
                  ["result"])


@dataclass(frozen=True)
class Instance:
    """One container instance to archive."""

    xid: int
    wid: int
    eid: int
    namespace: str
    pod_name: str
    pod_uid: str
    container: str
    attempt: int
    replica: str
    #: read it with ``previous=true`` (a restarted container's last instance)
    previous: bool
    finished: bool
    exit_code: int | None
    reason: str

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.pod_uid, self.container, self.attempt)


def instances(xid: int, wid: int, eid: int, pod: Mapping[str, Any], *, pods_per_job: int = 1,
              snapshot: bool = False) -> list[Instance]:
    """The container instances of ``pod`` whose log can be archived now.

    A running container is only taken with ``snapshot`` (its pod or JobSet is
    going away). The instance numbers follow the kubelet: instance ``k`` runs
    with ``restartCount == k``; during a crash-loop wait the last instance
    (``lastState``) is still ``restartCount`` and is what a plain log read
    returns; once the next one runs it is ``restartCount - 1``, read with
    ``previous``.
    """
    ref = podlogs.pod_ref(pod, pods_per_job)
    found: list[Instance] = []

    def add(container: str, attempt: int, previous: bool, finished: bool, term: Mapping[str, Any] | None) -> None:
        if attempt < 0:
            return
        found.append(Instance(
            xid=xid, wid=wid, eid=eid, namespace=ref.namespace, pod_name=ref.name, pod_uid=ref.uid,
            container=container, attempt=attempt, replica=ref.replica, previous=previous, finished=finished,
            exit_code=int(term["exitCode"]) if term and term.get("exitCode") is not None else None,
            reason=str((term or {}).get("reason") or ""),
        ))

    for name in ref.containers:
        cs = ref.statuses.get(name) or {}
        count = int(cs.get("restartCount") or 0)
        state = cs.get("state") or {}
        last = (cs.get("lastState") or {}).get("terminated")
        waiting = (state.get("waiting") or {}).get("reason")
        if state.get("terminated"):
            add(name, count, False, True, state["terminated"])
        elif last and waiting == "CrashLoopBackOff":
            add(name, count, False, True, last)
        elif last:
            add(name, count - 1, True, True, last)
            if snapshot and "running" in state:
                add(name, count, False, False, None)
        elif snapshot and "running" in state:
            add(name, count, False, False, None)
    return found


# --- the store -------------------------------------------------------------------------------


def _filesystem(url: str) -> tuple[Any, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")


def object_path(root: str, inst: Instance | PodLogArchive) -> str:
    return (f"{root}/{inst.namespace}/{inst.xid}/{inst.wid}/{inst.eid}/{inst.pod_name}/"
            f"{inst.container}.{inst.attempt}.log")


def write_object(url: str, inst: Instance, data: bytes) -> str:
    """Write one archived log; returns its full URL. Raises whatever the store raises."""
    fs, root = _filesystem(url)
    path = object_path(root, inst)
    parent = path.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    with fs.open(path, "wb") as handle:
        handle.write(data)
    protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    return path if "://" in path else f"{protocol}://{path}"


def read_object(url: str) -> bytes:
    import fsspec

    with fsspec.open(url, "rb") as handle:
        return handle.read()  # type: ignore[no-any-return]


def delete_object(url: str) -> None:
    """Delete one archived log; a missing object is already deleted."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass


def purge(*, older_than: datetime, limit: int = 5000) -> int:
    """Delete the archived logs (object, then row) archived, or lost, before ``older_than``.

    At most ``limit`` rows a run, oldest first; a PENDING row is never
    touched (it is still to be archived). An object the store fails to delete
    keeps its row (and so its place in the next run); how many rows went is
    returned.
    """
    old = Q(archived_at__lt=older_than) | Q(archived_at__isnull=True, status=LOST, created_at__lt=older_than)
    rows = list(PodLogArchive.objects.filter(old).exclude(status=PodLogArchive.Status.PENDING)
                .order_by("id").values_list("id", "url")[:limit])
    gone: list[int] = []
    for pk, url in rows:
        if url:
            try:
                delete_object(url)
            except Exception:
                log.warning("logs.archive.purge_failed", extra={"id": pk, "url": url}, exc_info=True)
                continue
        gone.append(pk)
    PodLogArchive.objects.filter(id__in=gone).delete()
    if gone:
        log.info("logs.archive.purged", extra={"rows": len(gone), "older_than": older_than.isoformat()})
    return len(gone)


def read_archived(row: PodLogArchive) -> list[podlogs.RawLine]:
    """The archived lines of one instance (as the kubelet stamped them)."""
    text = read_object(row.url).decode("utf-8", errors="replace")
    return [podlogs.split_timestamp(line) for line in text.splitlines()]


def last_bytes(lines: Iterable[podlogs.RawLine], max_bytes: int) -> tuple[bytes, bool, list[str]]:
    """The last whole lines that fit in ``max_bytes`` (``TS text\\n`` each), whether any were cut, the tail."""
    kept: deque[bytes] = deque()
    texts: deque[str] = deque(maxlen=TAIL_LINES)
    total = 0
    cut = False
    for line in lines:
        encoded = (f"{line.timestamp} {line.text}\n" if line.timestamp else f"{line.text}\n").encode()
        kept.append(encoded)
        texts.append(line.text)
        total += len(encoded)
        while total > max_bytes and kept:
            total -= len(kept.popleft())
            cut = True
    tail = list(texts)
    while tail and sum(len(t) + 1 for t in tail) > TAIL_BYTES:
        tail.pop(0)
    return b"".join(kept), cut, tail


# --- the archiver thread ---------------------------------------------------------------------


class Archiver:
    """Archives container logs on its own thread; see the module docstring."""

    def __init__(self, *, url: str | None = None, max_bytes: int | None = None,
                 on_archived: Callable[[Instance, PodLogArchive], None] | None = None,
                 can_write: Callable[[], bool] = lambda: True) -> None:
        self.url = url or settings.XMC_LOG_ARCHIVE_URL
        self.max_bytes = int(max_bytes if max_bytes is not None else settings.XMC_LOG_ARCHIVE_MAX_BYTES)
        self.on_archived = on_archived
        self.can_write = can_write
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[tuple[float, int, Instance]] = []  # (due monotonic, seq, instance)
        self._seq = itertools.count()
        self._known: dict[tuple[str, str, int], str] = {}  # key -> "queued" | "ARCHIVED" | "LOST"
        self._by_execution: dict[tuple[int, int, int], set[str]] = {}  # -> pod uids (to forget them)
        self._tails: dict[tuple[str, str], tuple[int, list[str], int | None, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: store writes done by this archiver (tests and metrics)
        self.writes = 0
        self.failures = 0

    # --- called from the reconciler's threads (never blocks on I/O) ------------------------------

    def observe(self, xid: int, wid: int, eid: int, pods: Iterable[Mapping[str, Any]], *,
                per_job: Mapping[str, int] | None = None, snapshot: bool = False) -> None:
        for pod in pods:
            rjob = str(((pod.get("metadata") or {}).get("labels") or {}).get(podlogs.RJOB_LABEL, ""))
            for inst in instances(xid, wid, eid, pod, pods_per_job=(per_job or {}).get(rjob, 1), snapshot=snapshot):
                self._enqueue(inst)

    def _enqueue(self, inst: Instance, delay: float = 0.0, *, retry: bool = False) -> None:
        with self._wake:
            state = self._known.get(inst.key)
            if state in (PodLogArchive.Status.ARCHIVED, LOST) or (state == "queued" and not retry):
                return
            self._known[inst.key] = "queued"
            self._by_execution.setdefault((inst.xid, inst.wid, inst.eid), set()).add(inst.pod_uid)
            heapq.heappush(self._queue, (time.monotonic() + delay, next(self._seq), inst))
            self._wake.notify()

    def forget(self, xid: int, wid: int, eid: int) -> None:
        """Drop what is remembered of an execution's pods (its JobSet is gone); the rows stay."""
        with self._lock:
            uids = self._by_execution.pop((xid, wid, eid), set())
            for key in [k for k, state in self._known.items() if k[0] in uids and state != "queued"]:
                del self._known[key]
            for tail_key in [k for k in self._tails if k[0] in uids]:
                del self._tails[tail_key]

    def settled(self, pod_uids: Iterable[str]) -> bool:
        """Every instance asked for of these pods is archived (or lost): nothing is queued."""
        wanted = set(pod_uids)
        with self._lock:
            return not any(state == "queued" for (uid, _, _), state in self._known.items() if uid in wanted)

    def tails(self, pod_uid: str) -> dict[str, tuple[int, list[str], int | None, str]]:
        """container -> (instance, last lines, exit code, reason) of the newest archived instance of a pod."""
        with self._lock:
            return {c: v for (uid, c), v in self._tails.items() if uid == pod_uid}

    # --- the thread -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-archiver", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                inst = self._next()
                if inst is None:
                    continue
                try:
                    self.process(inst)
                except Exception:  # noqa: BLE001 - retried below; the archiver never dies
                    close_old_connections()
                    log.exception("logs.archive_crashed", extra={"pod": inst.pod_name})
                    self._retry(inst, None, "internal error")
        finally:
            connection.close()

    def _next(self) -> Instance | None:
        with self._wake:
            if not self._queue:
                self._wake.wait(0.5)
                return None
            due, _, inst = self._queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                self._wake.wait(min(wait, 0.5))
                return None
            heapq.heappop(self._queue)
            return inst

    def drain(self, timeout: float = 10.0) -> None:
        """Process what is due now on the calling thread (``--once`` and tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                due = [item for item in self._queue if item[0] <= time.monotonic()]
                if not due:
                    return
                item = min(due)
                self._queue.remove(item)
                heapq.heapify(self._queue)
            self.process(item[2])

    def process(self, inst: Instance) -> None:
        """Archive one instance unless it already is (idempotent)."""
        if not self.can_write():
            self._retry(inst, None, "not the leader", count=False)
            return
        row = self._row(inst)
        if row.status in (PodLogArchive.Status.ARCHIVED, LOST):
            RESULTS.labels("known").inc()
            self._settle(inst, row)
            return
        ref = podlogs.PodRef(namespace=inst.namespace, name=inst.pod_name, uid=inst.pod_uid, replica=inst.replica,
                             containers=(inst.container,), statuses={}, phase="", node="", created="",
                             restart_attempt=0, deleting=False, raw={})
        try:
            lines = podlogs.read_lines(ref, inst.container, previous=inst.previous)
            data, cut, tail = last_bytes(lines, self.max_bytes)
        except client.ApiException as exc:
            if exc.status in (400, 404):
                # Gone (pod deleted, or that instance no longer kept by the kubelet): nothing left to read.
                PodLogArchive.objects.filter(pk=row.pk).update(
                    status=LOST, last_error=f"{exc.status}: {(exc.body or exc.reason or '')[:500]}",
                    attempts=row.attempts + 1)
                row.refresh_from_db()
                RESULTS.labels("lost").inc()
                log.warning("logs.archive_lost", extra={"pod": inst.pod_name, "container": inst.container,
                                                        "attempt": inst.attempt, "status": exc.status})
                self._settle(inst, row)
                return
            self._retry(inst, row, f"{exc.status}: {exc.reason}")
            return
        except Exception as exc:  # noqa: BLE001 - API unreachable: retry
            self._retry(inst, row, repr(exc))
            return
        try:
            url = write_object(self.url, inst, data)
        except Exception as exc:  # noqa: BLE001 - whatever the store raises: retry
            self._retry(inst, row, repr(exc))
            return
        self.writes += 1
        RESULTS.labels("archived").inc()
        now = timezone.now()
        PodLogArchive.objects.filter(pk=row.pk).update(
            status=PodLogArchive.Status.ARCHIVED, url=url, bytes=len(data), truncated=cut, tail="\n".join(tail),
            attempts=row.attempts + 1, archived_at=now, last_error="", next_try_at=None)
        row.refresh_from_db()
        log.info("logs.archived", extra={"pod": inst.pod_name, "container": inst.container, "attempt": inst.attempt,
                                         "bytes": len(data), "truncated": cut, "xid": inst.xid, "wid": inst.wid,
                                         "eid": inst.eid})
        self._settle(inst, row)

    def _row(self, inst: Instance) -> PodLogArchive:
        fields = dict(xid=inst.xid, wid=inst.wid, eid=inst.eid, namespace=inst.namespace, pod_name=inst.pod_name,
                      replica=inst.replica, finished=inst.finished, exit_code=inst.exit_code, reason=inst.reason)
        try:
            row, _ = PodLogArchive.objects.get_or_create(pod_uid=inst.pod_uid, container=inst.container,
                                                         attempt=inst.attempt, defaults=fields)
        except IntegrityError:  # created meanwhile (another process): read it
            row = PodLogArchive.objects.get(pod_uid=inst.pod_uid, container=inst.container, attempt=inst.attempt)
        return row

    def _settle(self, inst: Instance, row: PodLogArchive) -> None:
        with self._lock:
            self._known[inst.key] = str(row.status)
            if row.status == PodLogArchive.Status.ARCHIVED:
                held = self._tails.get((inst.pod_uid, inst.container))
                if held is None or held[0] <= inst.attempt:
                    self._tails[(inst.pod_uid, inst.container)] = (
                        inst.attempt, row.tail.splitlines() if row.tail else [], row.exit_code, row.reason)
        if self.on_archived is not None and row.status == PodLogArchive.Status.ARCHIVED:
            try:
                self.on_archived(inst, row)
            except Exception:  # noqa: BLE001
                log.exception("logs.on_archived_failed")

    def _retry(self, inst: Instance, row: PodLogArchive | None, error: str, *, count: bool = True) -> None:
        attempts = (row.attempts if row is not None else 0) + (1 if count else 0)
        delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1))
        if row is not None and count:
            PodLogArchive.objects.filter(pk=row.pk).update(
                attempts=attempts, last_error=error[:2000], next_try_at=timezone.now() + timedelta(seconds=delay))
        if count:
            self.failures += 1
            RESULTS.labels("failed").inc()
            log.warning("logs.archive_failed", extra={"pod": inst.pod_name, "container": inst.container,
                                                      "attempt": inst.attempt, "tries": attempts, "error": error[:300],
                                                      "retry_in_s": delay})
        self._enqueue(inst, delay=delay, retry=True)


def tail_from_rows(xid: int, wid: int, eid: int) -> dict[tuple[str, str], tuple[int, list[str], int | None, str]]:
    """(pod name, container) -> newest archived instance's (attempt, tail, exit code, reason), from the rows."""
    out: dict[tuple[str, str], tuple[int, list[str], int | None, str]] = {}
    rows = PodLogArchive.objects.filter(xid=xid, wid=wid, eid=eid, status=PodLogArchive.Status.ARCHIVED)
    for row in rows.order_by("attempt"):
        out[(row.pod_name, row.container)] = (row.attempt, row.tail.splitlines() if row.tail else [],
                                              row.exit_code, row.reason)
    return out

