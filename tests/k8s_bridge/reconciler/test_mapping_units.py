"""Pure parts of the mapping the simulator cannot produce (it has no OOM killer and no node loss).

These feed minimal pod shapes to the pure functions; everything the simulator
can produce is covered on real objects in test_mapping_table / test_end_to_end.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from k8s_bridge.reconciler import mapping


def pod(name: str, **status) -> dict:
    return {"metadata": {"name": name}, "spec": {"nodeName": "node-7", "containers": [{"name": "main", "image": "img:1"}]},
            "status": status}


def test_it_explains_an_oom_kill() -> None:
    message = mapping.failure_explanation([
        pod("p-0", containerStatuses=[{"name": "main", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]),
        pod("p-1", containerStatuses=[{"name": "main", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}}]),
    ])
    assert message is not None and message["severity"] == "ERROR"
    assert "OOMKilled" in message["userFacingText"] and "pod p-0 container main" in message["userFacingText"]
    assert "p-1" not in message["userFacingText"]


def test_it_explains_a_pod_lost_with_its_node() -> None:
    message = mapping.failure_explanation([pod("p-0", phase="Failed", reason="NodeLost")])
    assert message is not None and "pod p-0 on node-7 (NodeLost)" in message["userFacingText"]


def test_it_says_nothing_for_an_ordinary_failure() -> None:
    assert mapping.failure_explanation([pod("p-0", phase="Failed")]) is None


def test_it_skips_init_containers_in_startup_diagnostics() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    jobset = {"status": {"conditions": [{"type": "Suspended", "status": "False",
                                          "lastTransitionTime": "2025-12-31T23:00:00Z"}]}}
    waiting = {"state": {"waiting": {"reason": "ImagePullBackOff"}}}
    init_only = pod("p-0", initContainerStatuses=[{"name": "init", **waiting}],
                    containerStatuses=[{"name": "main", "state": {"waiting": {"reason": "PodInitializing"}}}])
    assert mapping.startup_diagnostic(jobset, [init_only], now=now, grace=timedelta(minutes=2)) is None
    regular = pod("p-0", containerStatuses=[{"name": "main", **waiting}])
    assert mapping.startup_diagnostic(jobset, [regular], now=now, grace=timedelta(minutes=2)) is not None
    assert mapping.startup_diagnostic(jobset, [regular], now=now, grace=timedelta(hours=2)) is None
