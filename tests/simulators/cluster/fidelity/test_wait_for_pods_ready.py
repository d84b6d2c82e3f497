"""waitForPodsReady is on by default, as in Kueue 0.19 (kueue apis/config/v1beta2/defaults.go),
and loops stuck pods exactly like a real cluster: evict with PodsReadyTimeout, suspend,
requeue with back-off, re-admit; deactivate past backoffLimitCount."""

from __future__ import annotations

from typing import Any, Callable

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def _short(timeout: str = "30s", limit: int | None = None, recovery: str | None = None) -> dict[str, Any]:
    wfpr: dict[str, Any] = {"enable": True, "timeout": timeout,
                            "requeuingStrategy": {"backoffBaseSeconds": 10, "backoffMaxSeconds": 3600, "backoffLimitCount": limit}}
    if recovery:
        wfpr["recoveryTimeout"] = recovery
    return {"waitForPodsReady": wfpr}


def _conds(obj: Any) -> dict[str, Any]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def test_it_has_wait_for_pods_ready_on_by_default(kube_cluster: Cluster) -> None:
    seen: list[Any] = []
    kube_cluster.handle.store.add_listener(lambda event, rt, obj: seen.extend(
        c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "PodsReady") if rt.plural == "workloads" else None)
    kube_cluster.create_jobset("eager", [rjob("main", replicas=2, script="pull=2s;run=forever")])
    first = kube_cluster.eventually(lambda: seen and seen[0], what="PodsReady condition on the workload")
    assert (first["status"], first["reason"], first["message"]) == ("False", "WaitForStart", "Not all pods are ready or succeeded")
    ready = kube_cluster.eventually(lambda: (c := kube_cluster.cond(kube_cluster.workload_of("eager"), "PodsReady")) and c["status"] == "True" and c,
                               what="PodsReady=True")
    assert (ready["reason"], ready["message"]) == ("Started", "All pods reached readiness and the workload is running")


def test_it_can_turn_wait_for_pods_ready_off(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(kueue={"waitForPodsReady": {"enable": False}})
    kube_cluster.create_jobset("calm", [rjob("main", script="pull=1s;run=forever")])
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("calm"), "Admitted")["status"] == "True", what="admitted")
    kube_cluster.eventually(lambda: kube_cluster.jobset("calm")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="running")
    assert kube_cluster.cond(kube_cluster.workload_of("calm"), "PodsReady") is None


def test_it_loops_an_image_pull_backoff_through_eviction_backoff_and_readmission(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(kueue=_short("30s", limit=2))
    suspends: list[bool] = []

    released: list[Any] = []

    def record(event: str, rt: Any, obj: Any) -> None:
        st = obj.get("status") or {}
        if rt.plural == "workloads" and (st.get("requeueState") or {}).get("count") == 1 and not st.get("admission"):
            released.append(obj)  # the Workload right after the first eviction released its quota
        if rt.plural == "jobsets" and obj["metadata"]["name"] == "stuck":
            value = bool(obj["spec"].get("suspend"))
            if not suspends or suspends[-1] != value:
                suspends.append(value)

    kube_cluster.handle.store.add_listener(record)
    kube_cluster.create_jobset("stuck", [rjob("main", script="pull=fail:ImagePullBackOff")])
    # The back-off is 10 simulated seconds (0.1 s wall): read the state the store saw at release.
    evicted = kube_cluster.eventually(lambda: released and released[0], what="first PodsReadyTimeout eviction released")
    name = evicted["metadata"]["name"]
    c = _conds(evicted)
    assert (c["Evicted"]["status"], c["Evicted"]["reason"], c["Evicted"]["message"]) == (
        "True", "PodsReadyTimeout", f"Exceeded the PodsReady timeout default/{name}")
    assert (c["Requeued"]["status"], c["Requeued"]["reason"]) == ("False", "PodsReadyTimeout")
    assert (c["QuotaReserved"]["status"], c["Admitted"]["status"], c["Admitted"]["reason"]) == ("False", "False", "NoReservation")
    assert evicted["status"]["requeueState"]["requeueAt"]
    assert {"reason": "PodsReadyTimeout", "underlyingCause": "WaitForStart", "count": 1} in evicted["status"]["schedulingStats"]["evictions"]
    # Created suspended, started on admission, stopped by the eviction.
    assert suspends[:3] == [True, False, True]

    # The 10 s back-off ends: Requeued=True/BackoffFinished, admitted again, suspended again.
    again = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("stuck")) and (w["status"].get("requeueState") or {}).get("count") == 2
                               and w, timeout=30, what="second timeout")
    assert any(e.reason == "EvictedDueToPodsReadyTimeout" for e in kube_cluster.events("Workload", name))
    assert {"Started", "Stopped"} <= {e.reason for e in kube_cluster.events("JobSet", "stuck")}
    assert suspends[:5] == [True, False, True, False, True]
    assert again["spec"].get("active", True) is True

    # Past backoffLimitCount (2) the workload is deactivated.
    last = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("stuck")) and w["spec"].get("active") is False
                              and not w["status"].get("admission") and w, timeout=40, what="deactivated")
    c = _conds(last)
    assert (c["Evicted"]["reason"], c["Evicted"]["message"]) == (
        "DeactivatedDueToRequeuingLimitExceeded", "The workload is deactivated due to exceeding the maximum number of re-queuing retries")
    assert (c["Requeued"]["status"], c["Requeued"]["reason"]) == ("False", "DeactivatedDueToRequeuingLimitExceeded")
    assert "DeactivationTarget" not in c and "requeueState" not in last["status"]
    assert kube_cluster.jobset("stuck")["spec"]["suspend"] is True


def test_it_evicts_unschedulable_pods_on_timeout(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(kueue=_short("20s"))
    kube_cluster.create_jobset("nowhere", [rjob("main", script="schedule=fail")])
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("nowhere")) and (w["status"].get("requeueState") or {}).get("count")
                            and w, what="evicted")
    assert any(e["reason"] == "PodsReadyTimeout" and e["underlyingCause"] == "WaitForStart"
               for e in wl["status"]["schedulingStats"]["evictions"])
    assert any(e.reason == "Stopped" for e in kube_cluster.events("JobSet", "nowhere"))


def test_it_evicts_a_crash_loop_after_the_recovery_timeout(make_kube_cluster: Callable[..., Cluster]) -> None:
    kube_cluster = make_kube_cluster(kueue=_short("60s", recovery="15s"))
    # Runs 5 s (ready), exits 1, CrashLoopBackOff 10 s, 20 s, ... (restartPolicy OnFailure).
    kube_cluster.create_jobset("flaky", [rjob("main", script="pull=0s;run=5s;exit=1", restart_policy="OnFailure", backoff_limit=50)])
    kube_cluster.eventually(lambda: kube_cluster.cond(kube_cluster.workload_of("flaky"), "PodsReady")["reason"] == "WaitForRecovery",
                       what="WaitForRecovery after the first crash")
    wl = kube_cluster.eventually(lambda: (w := kube_cluster.workload_of("flaky")) and (w["status"].get("schedulingStats") or {}).get("evictions")
                            and w, timeout=30, what="recovery timeout eviction")
    assert kube_cluster.cond(wl, "Evicted")["reason"] == "PodsReadyTimeout"
    assert [(e["reason"], e["underlyingCause"]) for e in wl["status"]["schedulingStats"]["evictions"]] == [("PodsReadyTimeout", "WaitForRecovery")]
