"""GroupCommit: concurrent callers of one key share batches; each gets its own result or error."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from workunits.group_commit import Batch, GroupCommit


class Recorder:
    """A ``run`` that records its batches; the first batch of a key waits for ``release`` when ``hold``."""

    def __init__(self, hold: bool = False) -> None:
        self.batches: list[tuple[str, list[int]]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.hold = hold
        self.after_ran = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, key: str, items: list[int]) -> Batch[int]:
        with self.lock:
            self.batches.append((key, list(items)))
            first = len(self.batches) == 1
        if first and self.hold:
            self.started.set()
            assert self.release.wait(10)
        if any(i < 0 for i in items):
            raise ValueError(f"negative item in {items}")
        return [i * 10 for i in items], self.after_ran.set


def submit_in_threads(group: GroupCommit[str, int, int], key: str, items: list[int],
                      results: dict[int, Any]) -> list[threading.Thread]:
    def call(item: int) -> None:
        try:
            results[item] = group.submit(key, item)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            results[item] = exc

    threads = []
    for item in items:
        thread = threading.Thread(target=call, args=(item,))
        thread.start()
        threads.append(thread)
        time.sleep(0.01)  # arrival order
    return threads


def wait_queued(group: GroupCommit[str, int, int], key: str, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(group._queues.get(key, ())) < n:  # noqa: SLF001 - observing the queue
        assert time.monotonic() < deadline, "callers did not queue"
        time.sleep(0.005)


def queue_behind_a_held_batch(max_batch: int, queued: list[int]) -> tuple[Recorder, dict[int, Any]]:
    """Item 1 leads a batch that is held while ``queued`` arrive in order; then release it and wait for all."""
    run = Recorder(hold=True)
    group = GroupCommit(run, max_batch=max_batch)
    results: dict[int, Any] = {}
    threads = submit_in_threads(group, "a", [1], results)
    assert run.started.wait(10)
    threads += submit_in_threads(group, "a", queued, results)
    wait_queued(group, "a", len(queued))
    run.release.set()
    for thread in threads:
        thread.join(10)
    return run, results


def test_it_runs_a_caller_alone_at_once_in_a_batch_of_its_own() -> None:
    run = Recorder()
    group = GroupCommit(run, max_batch=8)
    assert group.submit("a", 1) == 10
    assert group.submit("a", 2) == 20
    assert run.batches == [("a", [1]), ("a", [2])]
    assert group._queues == {}  # noqa: SLF001 - nothing left behind


def test_it_has_callers_that_arrive_while_a_batch_runs_share_the_next_one_in_arrival_order() -> None:
    run, results = queue_behind_a_held_batch(8, [2, 3, 4, 5])
    assert run.batches == [("a", [1]), ("a", [2, 3, 4, 5])]
    assert results == {1: 10, 2: 20, 3: 30, 4: 40, 5: 50}


def test_it_holds_at_most_max_batch_callers_in_a_batch() -> None:
    run, results = queue_behind_a_held_batch(2, [2, 3, 4, 5, 6])
    assert [items for _, items in run.batches] == [[1], [2, 3], [4, 5], [6]]
    assert results == {i: i * 10 for i in range(1, 7)}


def test_it_makes_other_keys_neither_wait_nor_share() -> None:
    run = Recorder(hold=True)
    group = GroupCommit(run, max_batch=8)
    results: dict[int, Any] = {}
    held = submit_in_threads(group, "a", [1], results)
    assert run.started.wait(10)
    assert group.submit("b", 7) == 70  # while "a" is held
    run.release.set()
    held[0].join(10)
    assert run.batches == [("a", [1]), ("b", [7])]


def test_it_runs_a_failing_batch_again_one_by_one_so_only_the_failing_caller_gets_the_error() -> None:
    run, results = queue_behind_a_held_batch(8, [2, -3, 4])
    assert [items for _, items in run.batches] == [[1], [2, -3, 4], [2], [-3], [4]]
    assert (results[1], results[2], results[4]) == (10, 20, 40)
    assert isinstance(results[-3], ValueError) and "[-3]" in str(results[-3])


def test_it_gives_the_followers_their_results_before_the_leaders_after_work_runs() -> None:
    follower_done = threading.Event()
    saw: list[bool] = []
    gate = threading.Event()

    def run(key: str, items: list[int]) -> Batch[int]:
        if items == [1]:
            assert gate.wait(10)

        def after() -> None:
            if items != [1]:
                saw.append(follower_done.wait(10))

        return [i for i in items], after

    group: GroupCommit[str, int, int] = GroupCommit(run, max_batch=8)
    results: dict[int, Any] = {}
    threads = submit_in_threads(group, "a", [1], results)
    time.sleep(0.05)
    follower = threading.Thread(target=lambda: (group.submit("a", 3), follower_done.set()))
    leader = threading.Thread(target=lambda: results.setdefault(2, group.submit("a", 2)))
    leader.start()
    wait_queued(group, "a", 1)
    follower.start()
    wait_queued(group, "a", 2)
    gate.set()
    for thread in [*threads, leader, follower]:
        thread.join(10)
    # Item 2 led the second batch ([2, 3]); its after-work saw item 3's caller already answered.
    assert saw == [True]


def test_it_requires_a_positive_max_batch() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        GroupCommit(Recorder(), max_batch=0)


def test_it_makes_a_run_that_answers_the_wrong_number_of_items_an_error_not_a_silent_none() -> None:
    group: GroupCommit[str, int, int] = GroupCommit(lambda key, items: ([], None), max_batch=8)
    with pytest.raises(RuntimeError, match="0 results for a batch of 1"):
        group.submit("a", 1)
