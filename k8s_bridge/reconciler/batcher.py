"""The update batcher (Go: UpdateBatcher): many observations, one transaction per flush.

The reconciler never writes one observation per transaction. It puts each
masked update into a slot keyed ``(xid, wid, source)`` (source ``jobset``,
``workload`` or ``pods``); a newer update for the same slot replaces the
older one (latest wins).

Slots are held in ``connections`` shards (``XMC_RECONCILER_WRITE_CONNECTIONS``),
experiment ``xid`` in shard ``xid % connections``, and every shard is
flushed on its own connection (``workunits.writers.ParallelWriter``, one
thread and connection per shard), independently of the others: one
``workunits.services.update_work_unit_executions`` call per flush, each
``flush_interval`` or as soon as ``max_batch`` of the shard's slots are
pending. A shard whose flush is still running is not flushed again until it
ends, so one experiment never has two writes in flight and an older update
can never commit after a newer one of the same slot. Shards never share an
experiment, so their transactions never lock the same rows, and while one
shard's thread prepares its statements in Python another's can wait on the
database: no flush waits for another shard's (measured by
``bench/update_executions.py``).

Failure handling, decided here and nowhere else:

* A failed flush (database down, serialization failure) keeps its shard's
  slots and that shard is retried with backoff; the other shards go on.
  Slots are removed only after commit, and only if no newer update replaced
  them while the flush ran, so nothing is lost and nothing newer is
  overwritten by something older.
* An update the service rejects as invalid (``InvalidArgument``) is dropped
  with a log line and a metric instead of blocking the batch forever: when
  the error names the update (``updates[i]``) that one goes, otherwise the
  batch is bisected until the culprit is alone.
* ``can_write`` (the leader lease) is asked right before every write; a
  reconciler that lost its lease writes nothing more.
* ``stop(drain=True)`` (SIGTERM) lets the running flushes finish and writes
  what is pending once more before returning.

After each committed write ``on_committed(transitions, updates)`` runs in
the thread of the shard that wrote it, one call at a time across shards (the
controller publishes lifecycle hooks from it), even when a later write of
the same flush failed; its failures are logged.
"""
from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from django.db import close_old_connections, connection

from core.errors import InvalidArgument
from k8s_bridge.reconciler import metrics
from workunits import services
from workunits import state as guards
from workunits.services import Transition
from workunits.writers import ParallelWriter

log = logging.getLogger(__name__)

#: Sources of slots, in the order their updates are written within one work unit:
#: the state first, so a diagnostic message written after it is not reset by it.
SOURCES = ("jobset", "workload", "pods")
_SOURCE_ORDER = {name: i for i, name in enumerate(SOURCES)}

SlotKey = tuple[int, int, str]
Writer = Callable[[Sequence[guards.ExecutionUpdate]], list[Transition]]
Committed = Callable[[list[Transition], list[guards.ExecutionUpdate]], None]
Commits = list[tuple[list[Transition], list[guards.ExecutionUpdate]]]

_NAMED_INDEX = re.compile(r"updates\[(\d+)\]")


@dataclass
class _Slot:
    seq: int
    update: guards.ExecutionUpdate
    #: monotonic time the observation behind the update was seen (lag metric)
    seen: float


@dataclass(eq=False)
class _Shard:
    """The slots of the experiments with ``xid % connections == index``, and their flushes."""

    index: int
    slots: dict[SlotKey, _Slot] = field(default_factory=dict)
    #: one flush of this shard at a time, whoever runs it (its thread, ``flush()``, the drain)
    flush_lock: threading.Lock = field(default_factory=threading.Lock)
    #: set while the flusher thread has handed a flush of this shard to its connection
    running: bool = False
    #: consecutive failed flushes (the backoff), and when the last flush started and ended
    failures: int = 0
    last_start: float = float("-inf")
    last_end: float = float("-inf")


def _slot_order(item: tuple[SlotKey, _Slot]) -> tuple[int, int, int]:
    (xid, wid, source), _ = item
    return (xid, wid, _SOURCE_ORDER[source])


def _default_writer(updates: Sequence[guards.ExecutionUpdate]) -> list[Transition]:
    return services.update_work_unit_executions(updates)


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
        if connections < 1:
            raise ValueError(f"connections must be at least 1 (got {connections})")
        self._write = write or _default_writer
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self._on_committed = on_committed
        self._can_write = can_write
        self._retry_base_s = retry_base_s
        self._retry_max_s = retry_max_s
        self._shards = [_Shard(i) for i in range(connections)]
        self._seq = itertools.count(1)
        self._lock = threading.Lock()  # every shard's slots and running flag
        self._hook_lock = threading.Lock()  # on_committed: one call at a time
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer: ParallelWriter | None = None
        self._writer_lock = threading.Lock()  # the flusher thread and a caller may both need it first

    # --- producers -------------------------------------------------------------------

    def put(self, source: str, update: guards.ExecutionUpdate, *, seen: float | None = None) -> None:
        """Queue ``update`` in slot (xid, wid, source); a pending older one is replaced."""
        if source not in _SOURCE_ORDER:
            raise ValueError(f"unknown batcher source {source!r}; expected one of {SOURCES}")
        shard = self._shards[update.xid % len(self._shards)]
        with self._lock:
            shard.slots[(update.xid, update.wid, source)] = _Slot(
                next(self._seq), update, time.monotonic() if seen is None else seen
            )
            full = len(shard.slots) >= self.max_batch
            total = sum(len(s.slots) for s in self._shards)
        metrics.PENDING.set(total)
        if full:
            self._wake.set()

    def pending(self) -> dict[SlotKey, guards.ExecutionUpdate]:
        with self._lock:
            return {k: s.update for shard in self._shards for k, s in shard.slots.items()}

    def discard(self) -> None:
        """Forget everything pending (the lease was lost: someone else writes now)."""
        with self._lock:
            for shard in self._shards:
                shard.slots.clear()
        metrics.PENDING.set(0)

    # --- flushing -------------------------------------------------------------------------

    def flush(self) -> bool:
        """Write what is pending now; ``True`` when all of it committed (or nothing was pending).

        Every shard is flushed on its own connection, at once; a flush of a
        shard already running is waited for first. A shard that commits is
        settled and reported to ``on_committed`` even when another fails;
        only the failed shards' slots stay for the retry.
        """
        outcomes = self._parallel_writer().map(self._flush_shard, self._shards)
        for shard, outcome in zip(self._shards, outcomes):
            if isinstance(outcome, Exception):  # a bug in the flush itself: its slots stay
                log.error("reconciler.flush_crashed", exc_info=outcome, extra={"shard": shard.index})
        return all(outcome is True for outcome in outcomes)

    def _parallel_writer(self) -> ParallelWriter:
        with self._writer_lock:
            if self._writer is None:
                self._writer = ParallelWriter(len(self._shards))
            return self._writer

    def _flush_shard(self, shard: _Shard) -> bool:
        """Write ``shard``'s pending slots in one call (on the caller's connection)."""
        with shard.flush_lock:
            with self._lock:
                batch = sorted(shard.slots.items(), key=_slot_order)
            if not batch:
                return True
            shard.last_start = time.monotonic()  # a skipped flush waits its interval too
            if not self._can_write():
                log.info("reconciler.flush_skipped_not_leader", extra={"pending": len(batch), "shard": shard.index})
                return False
            metrics.BATCH_SIZE.observe(len(batch))
            settled: list[tuple[SlotKey, _Slot]] = []
            commits: Commits = []
            error: Exception | None = None
            try:
                self._write_all(batch, commits, settled)
            except Exception as exc:  # noqa: BLE001 - the shard is retried with backoff
                error = exc
            self._report(commits)  # what committed before a failure is reported all the same
            with self._lock:
                for key, slot in settled:
                    current = shard.slots.get(key)
                    if current is not None and current.seq == slot.seq:
                        del shard.slots[key]  # a newer update that arrived meanwhile stays
                metrics.PENDING.set(sum(len(s.slots) for s in self._shards))
            shard.last_end = time.monotonic()
            if error is not None:
                shard.failures += 1
                metrics.FLUSHES.labels("failed").inc()
                log.error("reconciler.flush_failed", exc_info=error,
                          extra={"batch": len(batch), "settled": len(settled), "shard": shard.index,
                                 "failures": shard.failures})
                close_old_connections()
                return False
            shard.failures = 0
            metrics.FLUSHES.labels("committed").inc()
            log.info("reconciler.flush", extra={"batch": len(batch), "settled": len(settled), "shard": shard.index})
            return True

    def _report(self, commits: Commits) -> None:
        if self._on_committed is None:
            return
        with self._hook_lock:
            for transitions, updates in commits:
                try:
                    self._on_committed(transitions, updates)
                except Exception:  # a hook must never undo or block a committed flush
                    log.exception("reconciler.on_committed_failed")

    def _write_all(self, batch: list[tuple[SlotKey, _Slot]], commits: Commits,
                   settled: list[tuple[SlotKey, _Slot]]) -> None:
        """Write ``batch``, adding its committed writes to ``commits`` and its settled slots
        (committed or dropped) to ``settled``; a write error propagates after what already
        committed was added."""
        updates = [slot.update for _, slot in batch]
        started = time.monotonic()
        try:
            transitions = self._write(updates)
        except InvalidArgument as exc:
            self._split_invalid(batch, exc, commits, settled)
            return
        finished = time.monotonic()
        metrics.WRITE_SECONDS.observe(finished - started)
        for _, slot in batch:
            metrics.LAG_SECONDS.observe(max(0.0, finished - slot.seen))
        self._count_outcomes(updates, transitions)
        commits.append((transitions, updates))
        settled += batch

    def _split_invalid(self, batch: list[tuple[SlotKey, _Slot]], exc: InvalidArgument, commits: Commits,
                       settled: list[tuple[SlotKey, _Slot]]) -> None:
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
            settled.append((key, slot))
            rest = batch[:index] + batch[index + 1:]
            if rest:
                self._write_all(rest, commits, settled)
            return
        middle = len(batch) // 2
        self._write_all(batch[:middle], commits, settled)
        self._write_all(batch[middle:], commits, settled)

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
            connection.close()  # this thread's own database connection (one shard writes on it)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()  # before looking: a put or a finished flush from now on wakes us again
            delay = self._start_due_flushes(time.monotonic())
            if delay > 0:
                self._wake.wait(delay)

    def _due(self, shard: _Shard, now: float) -> float:
        """When ``shard`` should flush next (``inf``: nothing pending, or its flush is running)."""
        if shard.running or not shard.slots:
            return float("inf")
        if shard.failures:
            return shard.last_end + min(self._retry_max_s, self._retry_base_s * (1 << min(shard.failures, 10)))
        if len(shard.slots) >= self.max_batch:
            return now
        # The interval runs from the start of the previous flush: a flush slower than the
        # interval is followed at once by the next one (what piled up meanwhile).
        return shard.last_start + self.flush_interval_s

    def _start_due_flushes(self, now: float) -> float:
        """Hand every due shard to its connection; seconds until the next one is due."""
        with self._lock:
            due_at = {shard.index: self._due(shard, now) for shard in self._shards}
            started = [shard for shard in self._shards if due_at[shard.index] <= now]
            for shard in started:
                shard.running = True
        writer = self._parallel_writer()
        for shard in started:
            writer.submit(shard.index, partial(self._flush_in_background, shard))
        if started:
            return 0.0  # look again at once (with one connection the flush has run meanwhile)
        return min([self.flush_interval_s, *(at - now for at in due_at.values())])

    def _flush_in_background(self, shard: _Shard) -> None:
        try:
            self._flush_shard(shard)
        except Exception:  # noqa: BLE001 - a bug in the flush: logged, the slots stay, the loop goes on
            log.exception("reconciler.flush_crashed", extra={"shard": shard.index})
            with self._lock:
                shard.failures += 1
                shard.last_end = time.monotonic()
        finally:
            with self._lock:
                shard.running = False
            self._wake.set()  # the loop looks at this shard again (what piled up meanwhile)

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
            with self._writer_lock:
                writer, self._writer = self._writer, None
            if writer is not None:
                writer.close()  # waits for running flushes; closes the threads' connections

    def _drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            if not self.flush():
                if not self._can_write():
                    break
                time.sleep(min(1.0, self._retry_base_s))
        if self.pending():
            log.error("reconciler.drain_incomplete", extra={"pending": len(self.pending())})
