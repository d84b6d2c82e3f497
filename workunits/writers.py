"""Guarded execution writes through several database connections at once.

One connection tops out at what one Postgres backend (and one Python thread
preparing its statements) can do. ``ParallelWriter`` keeps N long-lived
threads, each with its own connection: ``write`` splits a batch *by
experiment* into at most N parts, and each part is one ordinary
``workunits.services.update_work_unit_executions`` call on its own
connection. Because an experiment's updates all go to one part, two parts
never lock the same work unit or experiment row, and within each part the
service takes its locks in the usual (xid, wid) then xid order, so the
parts cannot deadlock with each other or with any other writer. Each part
is its own transaction: one part can fail (``InvalidUpdates``, a lost
connection) while the others commit; ``WriteResult.failed`` says which
updates to retry or drop.

The reconciler's batcher (``k8s_bridge.reconciler.batcher``) uses the
threads without ``write``: it keeps one shard of experiments per connection
(``xid % N``) and hands each shard's flushes to that shard's connection with
``submit``, so no shard waits for another's. N is
``XMC_RECONCILER_WRITE_CONNECTIONS``.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from operator import attrgetter
from typing import Any, TypeVar

from django.conf import settings
from django.db import close_old_connections, connections

from workunits import services
from workunits.services import Transition
from workunits.state import ExecutionUpdate


T = TypeVar("T")
R = TypeVar("R")


def split_by_experiment(
    items: Sequence[T], parts: int, xid: Callable[[T], int] = attrgetter("xid")
) -> list[list[T]]:
    """At most ``parts`` non-empty lists; every experiment's items in one list, in batch order.

    ``xid`` reads an item's experiment (default: its ``xid`` attribute, as on
    an ``ExecutionUpdate``). Experiments are dealt largest first to the least
    loaded part, so parts are about equal when the batch spans enough
    experiments.
    """
    by_xid: dict[int, list[T]] = {}
    for item in items:
        by_xid.setdefault(xid(item), []).append(item)
    buckets: list[list[T]] = [[] for _ in range(max(1, parts))]
    loads = [0] * len(buckets)
    for key in sorted(by_xid, key=lambda x: (-len(by_xid[x]), x)):
        target = loads.index(min(loads))
        buckets[target].extend(by_xid[key])
        loads[target] += len(by_xid[key])
    # Each experiment's items stay in batch order (experiments are independent).
    return [bucket for bucket in buckets if bucket]


@dataclass
class WriteResult:
    """What a parallel write committed and what it did not."""

    #: Transitions of every part that committed (part by part, each in batch order).
    transitions: list[Transition] = field(default_factory=list)
    #: Parts that did not commit: their updates and the error (nothing of them was written).
    failed: list[tuple[list[ExecutionUpdate], BaseException]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


class _Worker(threading.Thread):
    """A thread with its own Django database connection, running one job at a time."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()

    def run(self) -> None:
        try:
            while (job := self.jobs.get()) is not None:
                fn, future = job
                if not future.set_running_or_notify_cancel():
                    continue
                close_old_connections()  # drop a connection that broke or grew too old
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)
        finally:
            connections.close_all()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self.jobs.put((fn, future))
        return future


class ParallelWriter:
    """N long-lived writer connections; ``write`` splits a batch over them by experiment.

    With one connection the write runs in the caller's thread and
    connection. ``close()`` stops the threads and closes their connections;
    the writer is also a context manager.
    """

    def __init__(self, connections: int | None = None) -> None:
        n = settings.XMC_RECONCILER_WRITE_CONNECTIONS if connections is None else connections
        if n < 1:
            raise ValueError(f"connections must be at least 1 (got {n})")
        self.connections = n
        self._workers = [_Worker(f"xmc-writer-{i}") for i in range(n)] if n > 1 else []
        for worker in self._workers:
            worker.start()

    def write(self, updates: Sequence[ExecutionUpdate], *, now: datetime | None = None) -> WriteResult:
        result = WriteResult()
        parts = split_by_experiment(updates, self.connections)
        for part, outcome in zip(parts, self.map(partial(services.update_work_unit_executions, now=now), parts)):
            if isinstance(outcome, Exception):
                result.failed.append((part, outcome))
            else:
                result.transitions.extend(outcome)
        return result

    def map(self, fn: Callable[[T], R], parts: Sequence[T]) -> list[R | Exception]:
        """``fn(part)`` for each part, part i on connection i (at most ``connections`` parts).

        Returns each part's result or the exception it raised, in order. The
        caller splits its work by experiment (``split_by_experiment``) so
        that no two parts lock the same rows.
        """
        if len(parts) > max(1, len(self._workers)):
            raise ValueError(f"{len(parts)} parts for {self.connections} connection(s)")
        outcomes: list[R | Exception] = []
        for future in [self.submit(i, partial(fn, part)) for i, part in enumerate(parts)]:
            try:
                outcomes.append(future.result())
            except Exception as exc:  # noqa: BLE001 - reported in the result
                outcomes.append(exc)
        return outcomes

    def submit(self, index: int, fn: Callable[[], R]) -> Future[R]:
        """Run ``fn()`` on connection ``index`` without waiting for it; its future.

        Jobs for one connection run one after another, in order. With one
        connection ``fn`` runs in the caller's thread and connection, before
        this returns.
        """
        if not self._workers:
            future: Future[R] = Future()
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - in the future, as a worker would
                future.set_exception(exc)
            return future
        return self._workers[index].submit(fn)

    def close(self) -> None:
        for worker in self._workers:
            worker.jobs.put(None)
        for worker in self._workers:
            worker.join()
        self._workers = []

    def __enter__(self) -> ParallelWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def update_work_unit_executions_parallel(
    updates: Sequence[ExecutionUpdate], *, connections: int | None = None, now: datetime | None = None
) -> WriteResult:
    """One parallel write through a throw-away ``ParallelWriter`` (a batcher keeps one instead)."""
    with ParallelWriter(connections) as writer:
        return writer.write(updates, now=now)
