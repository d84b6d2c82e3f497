"""Reconciles are level-triggered and idempotent: running them again on a settled cluster writes nothing."""

from __future__ import annotations

import time

from tests.simulators.cluster.controllers.conftest import Sim, rjob


def _quiet(sim: Sim, wall: float = 0.3) -> bool:
    before = sim.store.resource_version
    time.sleep(wall)
    return sim.store.resource_version == before and sim.ctrls.wait_idle(1.0)


def test_it_changes_nothing_when_every_reconcile_runs_twice_on_a_settled_cluster(sim: Sim) -> None:
    sim.create_jobset("steady", [rjob("workers", replicas=2, pods=2, script="pull=0s;run=forever")])
    sim.create_jobset("finished", [rjob("main", script="pull=0s;run=1s;exit=0")])
    sim.create_jobset("broken", [rjob("main", script="pull=0s;run=1s;exit=1")])
    sim.eventually(lambda: sim.counters("steady")["workers"]["ready"] == 2, what="steady running")
    sim.eventually(lambda: sim.jobset("finished")["status"].get("terminalState") == "Completed", what="finished")
    sim.eventually(lambda: sim.jobset("broken")["status"].get("terminalState") == "Failed", what="broken")
    sim.eventually(lambda: _quiet(sim), timeout=10, what="no more writes")

    before = sim.store.resource_version
    ctrls = sim.ctrls
    for _ in range(2):
        for ns, name in ctrls.cache.keys("jobsets"):
            ctrls.jobset.run_once((ns, name))
            ctrls.kueue_jobs.run_once(("js", ns, name))
        for ns, name in ctrls.cache.keys("workloads"):
            ctrls.kueue_jobs.run_once(("wl", ns, name))
        for key in ctrls.cache.keys("jobs"):
            ctrls.job.run_once(key)
        for key in ctrls.cache.keys("pods"):
            ctrls.kubelet.run_once(key)
        ctrls.scheduler.cycle()
    assert sim.store.resource_version == before, "a repeated reconcile wrote something"
