"""The reconciler against the simulator and real Postgres: states as the cluster moves."""
from __future__ import annotations

from typing import Any

import pytest

from k8s_bridge import client
from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, execution, state_of
from tests.waiting import eventually
from workunits.choices import WorkUnitState
from workunits.models import StatusHistory

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState


def history(wu) -> list[str]:
    """The states the execution went through (history rows of field-only changes folded in)."""
    ex = execution(wu)
    states: list[str] = []
    for st in StatusHistory.objects.filter(execution=ex).order_by("id").values_list("to_state", flat=True):
        if not states or states[-1] != st:
            states.append(st)
    return states


def test_it_follows_a_jobset_from_queued_to_completed(cluster: Cluster, reconciler) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    assert state_of(wu) == S.INITIALIZING
    cluster.create_jobset(wu, script="pull=2s;run=8s;exit=0", replicas=2)

    eventually(lambda: state_of(wu) == S.COMPLETED, what="COMPLETED")
    states = [s for s in history(wu)]
    assert states[0] == S.INITIALIZING
    # Observations coalesce per flush (latest wins), so a short SCHEDULING or
    # STARTING may never be written (a queued one is, with its position: see
    # the quota tests); what is written follows the lifecycle order.
    assert S.RUNNING in states
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


def test_it_marks_a_failing_job_failed_after_its_restarts(cluster: Cluster, reconciler) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    cluster.create_jobset(wu, script="pull=1s;run=3s;exit=1", failure_policy={"maxRestarts": 1})
    eventually(lambda: state_of(wu) == S.FAILED, timeout=90, what="FAILED")
    states = history(wu)
    assert states[-1] == S.FAILED
    assert set(states) <= {S.INITIALIZING, S.SCHEDULING, S.STARTING, S.RUNNING, S.PARTIALLY_FAILED, S.FAILED}
    ex = execution(wu)
    assert ex.detailed_status["jobsetStatus"]["restarts"] == 1
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in ex.detailed_status["jobsetStatus"]["conditions"])
    assert ex.complete_time is not None



def test_it_reports_an_image_pull_failure_after_the_grace_period_then_the_eviction(make_cluster, make_reconciler) -> None:
    cluster = make_cluster(kueue={"waitForPodsReady": {
        "enable": True, "timeout": "60s",
        "requeuingStrategy": {"backoffBaseSeconds": 600, "backoffMaxSeconds": 3600, "backoffLimitCount": None},
    }})
    make_reconciler(grace_s=20.0)
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    cluster.create_jobset(wu, script="pull=fail:ImagePullBackOff", image="gcr.io/proj/missing:v9")

    def error_message():
        message = execution(wu).system_message or {}
        return message if message.get("severity") == "ERROR" else None

    admitted_at = eventually(lambda: state_of(wu) == S.STARTING and cluster.now(), what="STARTING")
    message = eventually(error_message, what="ERROR system message")
    assert (cluster.now() - admitted_at).total_seconds() >= 20 - 1
    text = message["userFacingText"]
    assert "gcr.io/proj/missing:v9" in text and "container main" in text
    assert "ImagePullBackOff" in text or "ErrImagePull" in text
    assert f"xmc-{exp.id}-{wu.wid}-main-0-0" in text

    def evicted():
        ex = execution(wu)
        info = ex.scheduling_information or {}
        return ex.state == S.SCHEDULING and "PodsReadyTimeout" in info.get("userFacingText", "") and info

    info = eventually(evicted, what="evicted by PodsReadyTimeout, explained")
    assert "ImagePullBackOff" in info["userFacingText"] or "ErrImagePull" in info["userFacingText"]
    assert execution(wu).system_message is None  # the state changed: the startup diagnostic is reset


def test_it_stops_through_the_finalizer(cluster: Cluster, reconciler) -> None:
    from workunits import services

    exp = factories.experiment()
    wu = factories.work_unit(exp)
    cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    services.stop_work_units(exp.id, [wu.wid], batch=False)
    assert state_of(wu) == S.STOPPING
    cluster.delete_jobset(wu)  # what the actuator's Delete task does
    eventually(lambda: state_of(wu) == S.STOPPED, what="STOPPED")
    eventually(lambda: cluster.jobset(wu) is None, what="JobSet gone once the finalizer is removed")
    assert history(wu)[-2:] == [S.STOPPING, S.STOPPED]


def test_it_follows_a_restart_and_leaves_the_old_execution_alone(cluster: Cluster, reconciler) -> None:
    from workunits import services

    exp = factories.experiment()
    wu = factories.work_unit(exp)
    cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")
    eventually(lambda: state_of(wu) == S.RUNNING, what="eid 1 RUNNING")
    services.restart_work_units(exp.id, [wu.wid], batch=False)
    old = execution(wu, 1)
    old_history = list(StatusHistory.objects.filter(execution=old).values_list("id", flat=True))
    assert state_of(wu) == S.RESTARTING and execution(wu).eid == 2
    # The actuator's Restart: delete the eid-1 JobSet, wait until it is gone, create eid 2 (same name).
    cluster.delete_jobset(wu)
    eventually(lambda: cluster.jobset(wu) is None, what="eid-1 JobSet gone (finalizer removed although fenced)")
    cluster.create_jobset(wu, 2, script="pull=1s;run=300s;exit=0")
    eventually(lambda: state_of(wu, 2) == S.RUNNING, what="eid 2 RUNNING")
    states = history(wu)  # intermediate states may be coalesced by the batcher (latest wins)
    assert states[0] == S.RESTARTING and states[-1] == S.RUNNING
    assert set(states) <= {S.RESTARTING, S.SCHEDULING, S.STARTING, S.RUNNING}
    old.refresh_from_db()
    assert old.state == S.RUNNING and old.execution_state == "INACTIVE"
    assert list(StatusHistory.objects.filter(execution=old).values_list("id", flat=True)) == old_history


def workload_of(wu) -> dict:
    from k8s_bridge import client

    items = client.custom_objects().list_namespaced_custom_object(
        client.KUEUE_GROUP, "v1beta1", "default", client.WORKLOAD_PLURAL)["items"]
    return next(w for w in items if w["metadata"]["ownerReferences"][0]["name"] == f"xmc-{wu.experiment_id}-{wu.wid}")


def test_it_explains_a_deactivated_workload(cluster: Cluster, reconciler) -> None:
    from k8s_bridge import client

    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    client.custom_objects().patch_namespaced_custom_object(
        client.KUEUE_GROUP, "v1beta1", "default", client.WORKLOAD_PLURAL, workload_of(wu)["metadata"]["name"],
        {"spec": {"active": False}})

    def explained():
        ex = execution(wu)
        return ex.state == S.SCHEDULING and "Deactivated" in (ex.scheduling_information or {}).get("userFacingText", "")

    eventually(explained, what="SCHEDULING, deactivated")


def test_it_explains_a_stopped_queue(cluster: Cluster, reconciler) -> None:
    from k8s_bridge import client

    client.custom_objects().patch_cluster_custom_object(
        client.KUEUE_GROUP, "v1beta1", "clusterqueues", "cluster-queue", {"spec": {"stopPolicy": "Hold"}})
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")

    def explained():
        ex = execution(wu)
        text = (ex.scheduling_information or {}).get("userFacingText", "")
        return ex.state == S.SCHEDULING and "cluster-queue is inactive" in text and text

    assert "cpu-queue" in eventually(explained, what="SCHEDULING, queue stopped")


def test_it_writes_terminal_states_from_the_finalizer_and_sweep_even_with_a_clock_behind(cluster: Cluster, make_reconciler) -> None:
    from datetime import timedelta

    from workunits import services
    from workunits.choices import TaskType
    from workunits.models import Operation

    rec = make_reconciler()
    exp = factories.experiment()
    deleted, vanished = factories.work_unit(exp), factories.work_unit(exp)
    for wu in (deleted, vanished):
        cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0")
    Operation.objects.filter(task_type=TaskType.CREATE).update(done=True)
    eventually(lambda: state_of(deleted) == S.RUNNING and state_of(vanished) == S.RUNNING, what="RUNNING")
    rec.stop(drain=False)
    services.stop_work_units(exp.id, [deleted.wid, vanished.wid], batch=True)
    cluster.strip_finalizer_and_delete(vanished)
    eventually(lambda: cluster.jobset(vanished) is None, what="vanished")
    behind = make_reconciler(now=lambda: cluster.now() - timedelta(hours=1))  # this host's clock is an hour behind
    cluster.delete_jobset(deleted)
    eventually(lambda: state_of(deleted) == S.STOPPED, what="STOPPED by the finalizer path")
    assert state_of(vanished) == S.STOPPED  # by the sweep of the start-up resync
    assert behind.resyncs >= 1


def test_it_fails_a_work_unit_whose_running_pod_is_deleted_and_says_why(cluster: Cluster, reconciler) -> None:
    # Upstream's Job controller counts a deleted pod as a failed one (kubernetes
    # pkg/controller/job/job_controller.go, isPodFailed): with backoffLimit 0 the
    # Job fails, the JobSet (no restarts) fails, and the execution is FAILED
    # with the deleted pod named in its message.
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    cluster.create_jobset(wu, script="pull=1s;run=300s;exit=0", backoff_limit=0)
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    core = client.core()
    [pod] = core.list_namespaced_pod("default", label_selector=f"jobset.sigs.k8s.io/jobset-name=xmc-{exp.id}-{wu.wid}").items
    core.delete_namespaced_pod(pod.metadata.name, "default")

    eventually(lambda: state_of(wu) == S.FAILED, timeout=120, what="FAILED after the pod was deleted")
    text = (execution(wu).system_message or {}).get("userFacingText", "")
    assert pod.metadata.name in text and "deleted" in text, text


def test_it_fails_an_out_of_memory_work_unit_and_says_oom(cluster: Cluster, reconciler) -> None:
    # The simulator's kubelet reports exit 137 with the `oom` flag as terminated reason
    # OOMKilled, as the kubelet does for a container the kernel killed for memory.
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    cluster.create_jobset(wu, script="pull=1s;run=2s;exit=137;oom", backoff_limit=0)

    eventually(lambda: state_of(wu) == S.FAILED, timeout=120, what="FAILED after the OOM kill")
    message = execution(wu).system_message or {}
    assert message.get("severity") == "ERROR", message
    assert "OOMKilled" in message.get("userFacingText", ""), message


def test_it_fails_a_work_unit_whose_node_is_lost_and_names_the_pod(cluster: Cluster, reconciler) -> None:
    # A lost node: the taint manager marks the pod DisruptionTarget and deletes it. No kubelet
    # confirms, so it stays Terminating and the Job only reaches FailureTarget (kubernetes
    # pkg/controller/job/job_controller.go waits for its pods to be gone) until someone
    # force-deletes the pod, as an operator (or the pod GC, once the Node object is removed)
    # does. Then the Job fails (backoffLimit 0), and the JobSet with it.
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    cluster.create_jobset(wu, script="pull=1s;run=forever;node=lost:3s", backoff_limit=0)
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    core = client.core()
    selector = f"jobset.sigs.k8s.io/jobset-name=xmc-{exp.id}-{wu.wid}"

    def stranded() -> Any:
        pods = core.list_namespaced_pod("default", label_selector=selector).items
        return pods[0] if pods and pods[0].metadata.deletion_timestamp else None

    eventually(stranded, timeout=60, what="the pod deleted by the taint manager")
    pod = stranded()
    assert state_of(wu) != S.FAILED  # a Terminating pod alone does not fail the Job
    core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)

    eventually(lambda: state_of(wu) == S.FAILED, timeout=120, what="FAILED after the node was lost")
    text = (execution(wu).system_message or {}).get("userFacingText", "")
    assert pod.metadata.name in text and "lost with its node" in text, text
