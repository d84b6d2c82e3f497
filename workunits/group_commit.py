"""Group commit: concurrent writers under one lock share one transaction.

Every CreateWorkUnit of an experiment locks the experiment row (its roll-up
and its next work-unit id live there), so creates of one experiment run one
after another however many threads serve them. A launch script adds its
work units concurrently (XManager's ``experiment.add`` is asynchronous), and
each create held the row lock across three round trips and the Python
between them, in a process whose threads all want the GIL: under load the
lock holder mostly waited for its own process (``idle in transaction``)
while the other creates of the experiment queued behind it.

`GroupCommit` combines them (flat combining): the first caller for a key
becomes the leader and runs ``run(key, items)`` for itself and for every
caller of the same key that queued while it ran, up to ``max_batch``; the
next queued caller then leads the next batch. A caller alone runs at once,
with no added wait. The batch is one transaction: one lock, one statement,
one commit for many creates.

A batch that raises is run again one item at a time, so one caller's
failure is never another's. ``run`` returns each item's result and,
optionally, work to do once the results are handed out (delivery to the
broker after commit): the next batch starts without waiting for it.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")

#: What ``run`` returns: one result per item, in order, and what to run after handing them out.
Batch = tuple[list[R], Callable[[], None] | None]


class _Waiter(Generic[T, R]):
    __slots__ = ("item", "woken", "lead", "result", "error")

    def __init__(self, item: T) -> None:
        self.item = item
        self.woken = threading.Event()
        self.lead = False
        self.result: R | None = None
        self.error: BaseException | None = None


class GroupCommit(Generic[K, T, R]):
    """Run ``run(key, items)`` for concurrent callers of one key in shared batches (see the module)."""

    def __init__(self, run: Callable[[K, list[T]], Batch[R]], *, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run = run
        self._max_batch = max_batch
        self._lock = threading.Lock()
        #: Per key with a leader at work: the callers waiting for the next batch.
        self._queues: dict[K, deque[_Waiter[T, R]]] = {}
        # A child forked while another thread led a batch must not wait for that thread.
        reset = weakref.WeakMethod(self._after_fork)
        os.register_at_fork(after_in_child=lambda: (method := reset()) and method())

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._queues = {}

    def submit(self, key: K, item: T) -> R:
        """``item``'s result, from a batch this thread or another one runs; raises what its run raised."""
        me: _Waiter[T, R] = _Waiter(item)
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                self._queues[key] = deque()
                me.lead = True
            else:
                queue.append(me)
        if not me.lead:
            me.woken.wait()
        if me.lead:  # first for this key, or promoted by the previous leader
            self._lead(key, me)
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]

    def _lead(self, key: K, me: _Waiter[T, R]) -> None:
        with self._lock:
            queue = self._queues[key]
            batch = [me] + [queue.popleft() for _ in range(min(len(queue), self._max_batch - 1))]
        after: list[Callable[[], None]] = []
        try:
            self._serve(key, batch, after)
        finally:
            with self._lock:
                queue = self._queues[key]
                if queue:
                    successor = queue.popleft()
                    successor.lead = True
                    successor.woken.set()
                else:
                    del self._queues[key]
            for waiter in batch[1:]:
                if not waiter.woken.is_set():  # the leader died mid-batch (e.g. KeyboardInterrupt)
                    waiter.error = RuntimeError("the batch this call was part of was interrupted")
                    waiter.woken.set()
        for work in after:
            work()

    def _serve(self, key: K, batch: list[_Waiter[T, R]], after: list[Callable[[], None]]) -> None:
        try:
            results, then = self._run(key, [w.item for w in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
        except Exception as exc:
            if len(batch) > 1:  # one item's failure must not be the others': each alone
                for waiter in batch:
                    self._serve(key, [waiter], after)
                return
            batch[0].error = exc
            results, then = [], None
        for waiter, result in zip(batch, results):
            waiter.result = result
        if then is not None:
            after.append(then)
        for waiter in batch:
            if waiter.lead:
                continue  # the leader is the thread running this
            waiter.woken.set()
