"""The update batcher (Go: UpdateBatcher): many observations, one transaction per flush.

The reconciler never writes one observation per transaction. It puts each
masked update into a slot keyed ``(xid, wid, source)`` (source ``jobset``,
``workload`` or ``pods``); a newer update for the same slot replaces the
older one (latest wins). A flusher thread writes every pending slot
each ``flush_interval`` or as soon as ``max_batch`` slots are pending: one
``workunits.services.update_work_unit_executions`` call per part, the batch
split by experiment over ``connections`` database connections
(``workunits.writers.ParallelWriter``; ``XMC_RECONCILER_WRITE_CONNECTIONS``).

Failure handling, decided here and nowhere else:

* A failed flush (database down, serialization failure) keeps every slot of
  the parts that failed and is retried with backoff; the parts that
  committed are settled and reported. Slots are removed only after commit, and only if
  no newer update replaced them while the flush ran, so nothing is lost and
  nothing newer is overwritten by something older.
* An update the service rejects as invalid (``InvalidArgument``) is dropped
  with a log line and a metric instead of blocking the batch forever: when
  the error names the update (``updates[i]``) that one goes, otherwise the
  batch is bisected until the culprit is alone.
* ``can_write`` (the leader lease) is asked right before every write; a
  reconciler that lost its lease writes nothing more.
* ``stop(drain=True)`` (SIGTERM) lets the current flush finish and writes
  what is pending once more before returning.

After each committed write ``on_committed(transitions, updates)`` runs in the
flushing thread (the controller publishes lifecycle hooks from it), for every
committed part even when another part failed; its failures are logged.
"""
from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import close_old_connections, connection

from k8s_bridge.reconciler import metrics
from workunits import state as guards
from workunits.services import Transition
from workunits.writers import ParallelWriter, split_by_experiment
from xmc.errors import InvalidArgument

log = logging.getLogger(__name__)

#: Sources of slots, in the order their updates are written within one work unit:
#: the state first, so a diagnostic message written after it is not reset by it.
SOURCES = ("jobset", "workload", "pods")
_SOURCE_ORDER = {name: i for i, name in enumerate(SOURCES)}

SlotKey = tuple[int, int, str]
Writer = Callable[[Sequence[guards.ExecutionUpdate]], list[Transition]]
Committed = Callable[[list[Transition], list[guards.ExecutionUpdate]], None]

_NAMED_INDEX = re.compile(r"updates\[(\d+)\]")


@dataclass
class _Slot:
    seq: int
    update: guards.ExecutionUpdate
    #: monotonic time the observation behind the update was seen (lag metric)
    seen: float


def _slot_xid(item: tuple[SlotKey, _Slot]) -> int:
    return item[0][0]


def _default_writer(updates: Sequence[guards.ExecutionUpdate]) -> list[Transition]:
    from workunits.services import update_work_unit_executions

    return update_work_unit_executions(updates)


class UpdateBatcher:
    def __init__(
        self,
        write: Writer | None = None,
        *,
        flush_interval_s: float = 0.2,
        max_batch: int = 500,
        on_committed: Committed | None = None,
        can_write: Callable[[], bool] = lambda: True,
        retry_base_s: float = 0.2,
        retry_max_s: float = 5.0,
        connections: int = 1,
    ) -> None:
        self._write = write or _default_writer
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self._on_committed = on_committed
        self._can_write = can_write
        self._retry_base_s = retry_base_s
        self._retry_max_s = retry_max_s
        self._slots: dict[SlotKey, _Slot] = {}
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flush_lock = threading.Lock()  # one flush at a time (thread or caller)
        self._thread: threading.Thread | None = None
        self._connections = connections
        self._writer: ParallelWriter | None = None
        self.failures = 0

    # --- producers -------------------------------------------------------------------

    def put(self, source: str, update: guards.ExecutionUpdate, *, seen: float | None = None) -> None:
        """Queue ``update`` in slot (xid, wid, source); a pending older one is replaced."""
        if source not in _SOURCE_ORDER:
            raise ValueError(f"unknown batcher source {source!r}; expected one of {SOURCES}")
        with self._lock:
            self._slots[(update.xid, update.wid, source)] = _Slot(
                next(self._seq), update, time.monotonic() if seen is None else seen
            )
            size = len(self._slots)
        metrics.PENDING.set(size)
        if size >= self.max_batch:
            self._wake.set()

    def pending(self) -> dict[SlotKey, guards.ExecutionUpdate]:
        with self._lock:
            return {k: s.update for k, s in self._slots.items()}

    def discard(self) -> None:
        """Forget everything pending (the lease was lost: someone else writes now)."""
        with self._lock:
            self._slots.clear()
        metrics.PENDING.set(0)

    # --- flushing -------------------------------------------------------------------------

    def flush(self) -> bool:
        """Write what is pending now; ``True`` when all of it committed (or nothing was pending).

        The batch is split by experiment over the writer's connections
        (``workunits.writers.split_by_experiment``); each part is its own
        transaction. A part that commits is settled and reported to
        ``on_committed`` even when another part fails; only the failed
        parts' slots stay for the retry.
        """
        with self._flush_lock:
            with self._lock:
                batch = sorted(self._slots.items(), key=lambda kv: (kv[0][0], kv[0][1], _SOURCE_ORDER[kv[0][2]]))
            if not batch:
                return True
            if not self._can_write():
                log.info("reconciler.flush_skipped_not_leader", extra={"pending": len(batch)})
                return False
            metrics.BATCH_SIZE.observe(len(batch))
            writer = self._parallel_writer()
            parts = split_by_experiment(batch, writer.connections, xid=_slot_xid)
            done: list[tuple[SlotKey, _Slot]] = []
            commits: list[tuple[list[Transition], list[guards.ExecutionUpdate]]] = []
            failed = 0
            for part, outcome in zip(parts, writer.map(self._write_part, parts)):
                if isinstance(outcome, Exception):
                    failed += len(part)
                    log.error("reconciler.flush_failed", exc_info=outcome,
                              extra={"batch": len(batch), "part": len(part), "failures": self.failures + 1})
                    continue
                settled, part_commits = outcome
                done += settled
                commits += part_commits
            for transitions, updates in commits:  # in this thread, whichever connection committed them
                if self._on_committed is not None:
                    try:
                        self._on_committed(transitions, updates)
                    except Exception:  # a hook must never undo or block a committed flush
                        log.exception("reconciler.on_committed_failed")
            with self._lock:
                for key, slot in done:
                    current = self._slots.get(key)
                    if current is not None and current.seq == slot.seq:
                        del self._slots[key]  # a newer update that arrived meanwhile stays
                metrics.PENDING.set(len(self._slots))
            if failed:
                self.failures += 1
                metrics.FLUSHES.labels("failed").inc()
                close_old_connections()
                return False
            self.failures = 0
            metrics.FLUSHES.labels("committed").inc()
            log.info("reconciler.flush", extra={"batch": len(batch), "settled": len(done)})
            return True

    def _parallel_writer(self) -> ParallelWriter:
        if self._writer is None:
            self._writer = ParallelWriter(self._connections)
        return self._writer

    def _write_part(self, part: list[tuple[SlotKey, _Slot]]) -> tuple[
        list[tuple[SlotKey, _Slot]], list[tuple[list[Transition], list[guards.ExecutionUpdate]]]
    ]:
        """Write one part (one connection): the settled slots and the commits to report."""
        commits: list[tuple[list[Transition], list[guards.ExecutionUpdate]]] = []
        return self._write_all(part, commits), commits

    def _write_all(self, batch: list[tuple[SlotKey, _Slot]],
                   commits: list[tuple[list[Transition], list[guards.ExecutionUpdate]]]) -> list[tuple[SlotKey, _Slot]]:
        """Write ``batch``; returns the slots that are settled (committed or dropped)."""
        updates = [slot.update for _, slot in batch]
        started = time.monotonic()
        try:
            transitions = self._write(updates)
        except InvalidArgument as exc:
            return self._split_invalid(batch, exc, commits)
        finished = time.monotonic()
        metrics.WRITE_SECONDS.observe(finished - started)
        for _, slot in batch:
            metrics.LAG_SECONDS.observe(max(0.0, finished - slot.seen))
        self._count_outcomes(updates, transitions)
        commits.append((transitions, updates))
        return batch

    def _split_invalid(self, batch: list[tuple[SlotKey, _Slot]], exc: InvalidArgument,
                       commits: list[tuple[list[Transition], list[guards.ExecutionUpdate]]]) -> list[tuple[SlotKey, _Slot]]:
        named = _NAMED_INDEX.search(f"{exc.field or ''} {exc.message}")
        if len(batch) == 1 or (named and int(named.group(1)) < len(batch)):
            index = 0 if len(batch) == 1 else int(named.group(1))  # type: ignore[union-attr]
            key, slot = batch[index]
            metrics.DROPPED.inc()
            metrics.OUTCOMES.labels("invalid").inc()
            log.error(
                "reconciler.update_dropped_invalid",
                extra={"xid": key[0], "wid": key[1], "source": key[2], "eid": slot.update.eid,
                       "error": str(exc), "field": exc.field},
            )
            rest = batch[:index] + batch[index + 1:]
            return [(key, slot), *(self._write_all(rest, commits) if rest else [])]
        middle = len(batch) // 2
        return self._write_all(batch[:middle], commits) + self._write_all(batch[middle:], commits)

    @staticmethod
    def _count_outcomes(updates: Sequence[guards.ExecutionUpdate], transitions: Sequence[Transition]) -> None:
        moved = {(t.xid, t.wid, t.eid, t.new_state) for t in transitions}
        for update in updates:
            if guards.STATE in update.mask:
                applied = (update.xid, update.wid, update.eid, update.state) in moved
                metrics.OUTCOMES.labels("applied" if applied else "not_applied").inc()

    # --- the flusher thread ---------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconciler-batcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            connection.close()  # this thread's own database connection

    def _loop(self) -> None:
        last_start = time.monotonic()
        while not self._stopping.is_set():
            # The interval runs from the start of the previous flush: a flush slower than the
            # interval is followed at once by the next one (what piled up meanwhile).
            delay = max(0.0, self.flush_interval_s - (time.monotonic() - last_start))
            if self.failures:
                delay = min(self._retry_max_s, self._retry_base_s * 2 ** min(self.failures, 10))
            if delay:
                self._wake.wait(delay)
            self._wake.clear()
            if self._stopping.is_set():
                break
            if not self.pending():
                self._wake.wait(self.flush_interval_s)  # idle: nothing to write
                self._wake.clear()
                if not self.pending():
                    continue
            last_start = time.monotonic()
            self.flush()

    def stop(self, *, drain: bool = True, timeout: float = 30.0) -> None:
        """Stop the flusher; with ``drain`` write what is pending (retrying until ``timeout``)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            if drain:
                self._drain(timeout)
        finally:
            if self._writer is not None:
                self._writer.close()  # its threads and their connections
                self._writer = None

    def _drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            if not self.flush():
                if not self._can_write():
                    break
                time.sleep(min(1.0, self._retry_base_s))
        if self.pending():
            log.error("reconciler.drain_incomplete", extra={"pending": len(self.pending())})
