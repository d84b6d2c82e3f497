"""Container restarts as the kubelet and the Job controller count them: the first restart is
immediate, restartCount rises when the new container starts, and for restartPolicy OnFailure
the Job fails once the restarts reach backoffLimit (kubernetes job_controller.go
`pastBackoffLimitOnFailure`: `>=`, not `>`)."""

from __future__ import annotations

from typing import Any

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def test_it_fails_an_on_failure_job_when_restarts_reach_the_backoff_limit(kube_cluster: Cluster) -> None:
    restarts: list[int] = []
    target: list[int] = []

    def record(event: str, rt: Any, obj: Any) -> None:
        if rt.plural == "pods":
            for cs in (obj.get("status") or {}).get("containerStatuses") or []:
                restarts.append(int(cs.get("restartCount") or 0))
        if rt.plural == "jobs" and any(c["type"] == "FailureTarget" for c in (obj.get("status") or {}).get("conditions") or []) \
                and not target:
            target.append(max(restarts or [0]))

    kube_cluster.handle.store.add_listener(record)
    kube_cluster.create_jobset("crashy", [rjob("main", script="pull=0s;crash=every:3s", restart_policy="OnFailure", backoff_limit=2)])
    job = kube_cluster.eventually(lambda: (j := kube_cluster.job("crashy-main-0")) and any(c.type == "Failed" for c in (j.status and j.status.conditions) or [])
                             and j, what="Job failed")
    assert next(c for c in job.status.conditions if c.type == "Failed").reason == "BackoffLimitExceeded"
    assert target == [2]
    # restartCount went 0 -> 1 at once (immediate first restart), then 2 after the 10 s back-off.
    assert restarts[0] == 0 and 1 in restarts and max(restarts) == 2
