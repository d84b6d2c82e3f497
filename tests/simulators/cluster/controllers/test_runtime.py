"""The controller runtime: informer cache ordering, work queue semantics, condition writes."""

from __future__ import annotations

import time
from typing import Any

from simulators.cluster.clock import SimClock
from simulators.cluster.controllers.runtime import ObjectCache, WorkQueue, set_condition


def _pod(name: str, rv: int, uid: str = "u1", owner: str | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid, "resourceVersion": str(rv)}
    if owner:
        md["ownerReferences"] = [{"uid": owner, "controller": True, "kind": "Job", "name": "j"}]
    return {"metadata": md}


def test_it_ignores_stale_and_post_mortem_events_in_the_cache() -> None:
    cache = ObjectCache()
    seen: list[str] = []
    cache.add_handler("pods", lambda event, obj, old: seen.append(f"{event}:{obj['metadata']['resourceVersion']}"))
    assert cache.apply("ADDED", "pods", _pod("p", 5, owner="job-1"))
    assert not cache.apply("MODIFIED", "pods", _pod("p", 4, owner="job-1")), "an older version arriving late is ignored"
    assert [o["metadata"]["name"] for o in cache.owned("pods", "job-1")] == ["p"]
    assert cache.apply("DELETED", "pods", _pod("p", 7, owner="job-1"))
    assert not cache.apply("MODIFIED", "pods", _pod("p", 6, owner="job-1")), "no resurrection after DELETED"
    assert cache.get("pods", "default", "p") is None and cache.owned("pods", "job-1") == []
    assert cache.apply("ADDED", "pods", _pod("p", 9, uid="u2")), "a new object with the same name is welcome"
    assert seen == ["ADDED:5", "DELETED:7", "ADDED:9"]


def test_it_queues_a_key_once_and_requeues_it_when_it_changes_while_processing() -> None:
    clock = SimClock(speed=100)
    try:
        q = WorkQueue(clock, "t")
        q.add("a")
        q.add("a")
        assert len(q) == 1
        key = q.get()
        q.add("a")  # changed while being processed
        assert len(q) == 0, "not handed to a second worker concurrently"
        q.done(key)
        assert q.get() == "a"
        q.done("a")

        q.add_after("b", 5)
        q.add_after("b", 50)  # later than the pending one: no second timer
        assert clock.pending_timers() == 1
        q.add_after("b", 1)  # earlier: scheduled too
        assert clock.pending_timers() == 2
        deadline = time.monotonic() + 2
        while len(q) == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert q.get() == "b"
    finally:
        clock.stop()


def test_it_moves_the_transition_time_only_when_a_condition_flips() -> None:
    conds: list[dict[str, Any]] = []
    assert not set_condition(conds, "Suspended", "False", "ResumeJobs", "m", 100.0, append_false=False)
    assert conds == [], "the JobSet rule: a False condition of a new type is not appended"
    assert set_condition(conds, "Suspended", "True", "SuspendedJobs", "jobset is suspended", 100.0, append_false=False)
    first = conds[0]["lastTransitionTime"]
    assert set_condition(conds, "Suspended", "True", "SuspendedJobs", "other message", 200.0)
    assert conds[0]["lastTransitionTime"] == first
    assert not set_condition(conds, "Suspended", "True", "SuspendedJobs", "other message", 300.0)
    assert set_condition(conds, "Suspended", "False", "ResumeJobs", "jobset is resumed", 400.0)
    assert conds[0]["lastTransitionTime"] > first
