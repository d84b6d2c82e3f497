"""The JobSet -> WorkUnitState table, row by row, on objects the simulator produced.

Several JobSets live through the situations of each rule while a watch
collects every version the simulator writes; each row then takes the real
objects that match its situation and checks the state the table gives.
"""
from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import pytest

from k8s_bridge import client
from k8s_bridge.reconciler.mapping import JOBSET_SELECTOR, condition_true, jobset_totals, to_work_unit_state
from tests.k8s_bridge.reconciler.conftest import Cluster
from tests.k8s_bridge.reconciler.test_end_to_end import small_queue
from tests.waiting import eventually
from workunits.choices import WorkUnitState

S = WorkUnitState


class Collector:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rv = ""
        while not self._stop.is_set():
            w = client.watch()
            for event in w.stream(client.custom_objects().list_namespaced_custom_object, client.JOBSET_GROUP,
                                  client.JOBSET_VERSION, "default", client.JOBSET_PLURAL,
                                  label_selector=JOBSET_SELECTOR, timeout_seconds=2, resource_version=rv):
                obj = event["raw_object"]
                rv = obj["metadata"]["resourceVersion"]
                self.seen.append(obj)

    def of(self, name: str) -> list[dict[str, Any]]:
        return [o for o in self.seen if o["metadata"]["name"] == name]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def unit(wid: int) -> Any:
    return types.SimpleNamespace(experiment_id=1, wid=wid, current_eid=1, refresh_from_db=lambda: None)


def deleting(o: dict[str, Any]) -> bool:
    return bool(o["metadata"].get("deletionTimestamp"))


ROWS: list[tuple[str, str, Callable[[dict[str, Any]], bool], str]] = [
    ("1 deleted after completing", "xmc-1-1", lambda o: deleting(o) and condition_true(o, "Completed"), S.COMPLETED),
    ("1 deleted after failing", "xmc-1-2", lambda o: deleting(o) and condition_true(o, "Failed"), S.FAILED),
    ("1 deleted while running", "xmc-1-3", lambda o: deleting(o), S.STOPPED),
    ("2 completed", "xmc-1-1", lambda o: not deleting(o) and condition_true(o, "Completed"), S.COMPLETED),
    ("3 failed", "xmc-1-2", lambda o: not deleting(o) and condition_true(o, "Failed"), S.FAILED),
    ("4 all ready", "xmc-1-3", lambda o: not deleting(o) and jobset_totals(o).ready == jobset_totals(o).replicas > 0,
     S.RUNNING),
    ("5 active, not all ready", "xmc-1-3",
     lambda o: jobset_totals(o).active > 0 and jobset_totals(o).ready < jobset_totals(o).replicas, S.STARTING),
    ("6 a job failed, nothing active, policy not done", "xmc-1-4",
     lambda o: jobset_totals(o).failed > 0 and jobset_totals(o).active == 0 and not condition_true(o, "Failed"),
     S.PARTIALLY_FAILED),
    ("7 evicted after some succeeded", "xmc-1-5",
     lambda o: jobset_totals(o).succeeded > 0 and jobset_totals(o).active == 0 and jobset_totals(o).ready == 0
     and not condition_true(o, "Completed"), S.RUNNING),
    ("8 queued", "xmc-1-6", lambda o: jobset_totals(o) == jobset_totals(o).__class__(jobset_totals(o).replicas, 0, 0, 0, 0),
     S.SCHEDULING),
]


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    from simulators.cluster.server import run_simulator
    from tests.fixtures.simulators import queues_config
    from django.conf import settings

    path = tmp_path_factory.mktemp("mapping")
    handle = run_simulator(port=0, speed=10.0, queues_config=str(queues_config(path, clusterQueues=small_queue("4"))),
                           kubeconfig_out=str(path / "kubeconfig"))
    old = settings.KUBECONFIG
    settings.KUBECONFIG = str(path / "kubeconfig")
    client.reset()
    collector = Collector()
    try:
        cluster = Cluster(handle)
        cluster.create_jobset(unit(1), script="pull=1s;run=2s;exit=0")
        cluster.create_jobset(unit(2), script="pull=1s;run=2s;exit=1")
        cluster.create_jobset(unit(3), script="pull=1s;ready=after:3s;run=300s;exit=0")
        cluster.create_jobset(unit(4), script="pull=1s;run=2s;exit=1", failure_policy={"maxRestarts": 3})
        # a worker that finishes and a driver that runs on (success needs the driver); then the
        # Workload is deactivated: suspended, nothing active, one job succeeded
        cluster.create_jobset(unit(5), script="pull=1s;run=300s;exit=0", extra_jobs={"worker": "pull=1s;run=1s;exit=0"},
                              success_policy={"operator": "All", "targetReplicatedJobs": ["main"]})
        eventually(lambda: any(condition_true(o, "Completed") for o in collector.of("xmc-1-1")), what="completed")
        eventually(lambda: any(condition_true(o, "Failed") for o in collector.of("xmc-1-2")), what="failed")
        eventually(lambda: any(jobset_totals(o).ready == 1 for o in collector.of("xmc-1-3")), what="ready")
        eventually(lambda: any(jobset_totals(o).failed for o in collector.of("xmc-1-4")), what="a failure")
        for wid in (1, 2, 3):
            cluster.delete_jobset(unit(wid))  # our finalizer keeps them (no reconciler runs here)
        eventually(lambda: all(any(deleting(o) for o in collector.of(f"xmc-1-{w}")) for w in (1, 2, 3)),
                   what="deletions seen")
        cluster.create_jobset(unit(6), script="pull=1s;run=2s;exit=0", cpu="100")  # never fits: queued
        eventually(lambda: collector.of("xmc-1-6"), what="queued JobSet seen")
        eventually(lambda: any(jobset_totals(o).succeeded for o in collector.of("xmc-1-5")), what="worker done")
        workload = next(w for w in client.custom_objects().list_namespaced_custom_object(
            client.KUEUE_GROUP, "v1beta1", "default", client.WORKLOAD_PLURAL)["items"]
            if w["metadata"]["ownerReferences"][0]["name"] == "xmc-1-5")
        client.custom_objects().patch_namespaced_custom_object(
            client.KUEUE_GROUP, "v1beta1", "default", client.WORKLOAD_PLURAL, workload["metadata"]["name"],
            {"spec": {"active": False}})
        eventually(lambda: any(jobset_totals(o).succeeded and not jobset_totals(o).active
                               for o in collector.of("xmc-1-5")), what="deactivated after a success")
    finally:
        collector.stop()
        handle.stop()
        settings.KUBECONFIG = old
        client.reset()
    by_name: dict[str, list[dict[str, Any]]] = {}
    for o in collector.seen:
        by_name.setdefault(o["metadata"]["name"], []).append(o)
    return by_name


@pytest.mark.parametrize("rule,name,situation,expected", ROWS, ids=[r[0] for r in ROWS])
def test_it_maps_simulator_objects_row_by_row(observed, rule: str, name: str, situation, expected: str) -> None:
    matching = [o for o in observed.get(name, []) if situation(o)]
    assert matching, f"the simulator never produced the situation of rule {rule!r}"
    assert {to_work_unit_state(o) for o in matching} == {expected}, rule
