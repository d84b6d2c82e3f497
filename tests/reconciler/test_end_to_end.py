"""The reconciler against the simulator and real Postgres: states as the cluster moves."""
from __future__ import annotations

import pytest

from tests import factories
from tests.reconciler.conftest import Cluster, eventually, execution, state_of
from workunits.choices import WorkUnitState
from workunits.models import StatusHistory

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState


def history(wu) -> list[str]:
    ex = execution(wu)
    return list(StatusHistory.objects.filter(execution=ex).order_by("id").values_list("to_state", flat=True))


def test_it_follows_a_jobset_from_queued_to_completed(cluster: Cluster, reconciler) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    assert state_of(wu) == S.INITIALIZING
    cluster.create_jobset(wu, script="pull=2s;run=8s;exit=0", replicas=2)

    eventually(lambda: state_of(wu) == S.COMPLETED, what="COMPLETED")
    states = [s for s in history(wu)]
    assert states[0] == S.INITIALIZING
    assert S.SCHEDULING in states and S.RUNNING in states
    order = [S.INITIALIZING, S.SCHEDULING, S.STARTING, S.RUNNING, S.COMPLETED]
    assert [s for s in states if s in order] == [s for s in order if s in states], states
    ex = execution(wu)
    assert ex.scheduling_information is None
    counters = ex.detailed_status["jobsetStatus"]["replicatedJobsStatus"]
    assert counters == [{"name": "main", "ready": 0, "succeeded": 2, "active": 0, "failed": 0}]
    assert ex.metadata["resourceName"] == f"xmc-{exp.id}-{wu.wid}"
    assert ex.metadata["namespace"] == "default"
    assert ex.metadata["resourceFlavor"] == "default-flavor"
    assert ex.metadata["managementCluster"] == {"clusterName": "sim"}


def small_queue(cpu: str = "1", **extra) -> list[dict]:
    cq = {
        "name": "cluster-queue", "namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
            {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                     {"name": "memory", "nominalQuota": "64Gi"}]}]}],
    }
    cq.update(extra)
    return [cq]


def test_it_shows_the_queue_position_while_scheduling_and_clears_it_when_running(make_cluster, make_reconciler) -> None:
    cluster = make_cluster(clusterQueues=small_queue("1"))
    make_reconciler()
    exp = factories.experiment()
    first, second, third = (factories.work_unit(exp) for _ in range(3))
    cluster.create_jobset(first, script="pull=1s;run=20s;exit=0")
    eventually(lambda: state_of(first) in (S.STARTING, S.RUNNING), what="first admitted")
    cluster.create_jobset(second, script="pull=1s;run=2s;exit=0")
    cluster.create_jobset(third, script="pull=1s;run=2s;exit=0")

    def queued(wu, position):
        ex = execution(wu)
        info = ex.scheduling_information or {}
        queue = (info.get("auxiliaryInfo") or {}).get("queueInfo") or {}
        return ex.state == S.SCHEDULING and queue.get("positionInQueue") == position and queue.get(
            "totalWorkloadsInQueue") == 2

    eventually(lambda: queued(second, 1), what="second at position 1 of 2")
    eventually(lambda: queued(third, 2), what="third at position 2 of 2")
    text = execution(third).scheduling_information["userFacingText"]
    assert "cpu-queue" in text and "position 2 of 2" in text

    eventually(lambda: state_of(second) in (S.STARTING, S.RUNNING, S.COMPLETED), timeout=90, what="second runs")
    assert execution(second).scheduling_information is None
    eventually(lambda: queued(third, 1) or state_of(third) != S.SCHEDULING, what="third moves up")


def test_it_explains_a_preemption_and_runs_again(make_cluster, make_reconciler) -> None:
    cluster = make_cluster(clusterQueues=small_queue("1"))
    make_reconciler()
    exp = factories.experiment()
    low, high = factories.work_unit(exp), factories.work_unit(exp)
    cluster.create_jobset(low, script="pull=1s;run=40s;exit=0", priority_class="low")
    eventually(lambda: state_of(low) == S.RUNNING, what="low running")
    cluster.create_jobset(high, script="pull=1s;run=5s;exit=0", priority_class="high")

    def preempted():
        ex = execution(low)
        info = ex.scheduling_information or {}
        return ex.state == S.SCHEDULING and "Preempted" in info.get("userFacingText", "")

    eventually(preempted, what="low preempted and back in SCHEDULING")
    text = execution(low).scheduling_information["userFacingText"]
    assert "priority 1000" in text, text
    eventually(lambda: state_of(high) == S.COMPLETED, timeout=90, what="high completes")
    eventually(lambda: state_of(low) == S.RUNNING, timeout=90, what="low runs again")
    assert execution(low).scheduling_information is None
    states = history(low)
    assert states.count(S.RUNNING) >= 2 and S.SCHEDULING in states[states.index(S.RUNNING):]
