"""Every terminal failure explained in the execution's system message, end to end on the simulator.

Each story makes the simulated cluster fail one way (the pod script, the Job's
limits, Kueue) and reads the ERROR message the reconciler wrote: which
replicated job and pod, which container, and the cause as the cluster
reported it. (OOMKilled, a lost node and a deleted pod: test_end_to_end.)
"""
from __future__ import annotations

from typing import Any

import pytest

from k8s_bridge import client
from k8s_bridge.reconciler import explain
from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, execution, state_of
from tests.waiting import eventually
from workunits.choices import WorkUnitState

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState

CQ_WITH_CHECK = [{
    "name": "cluster-queue", "admissionChecks": ["capacity"],
    "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "8"}]}]}],
}]


def failed_text(wu: Any, needle: str, timeout: float = 90) -> str:
    def explained() -> str | None:
        ex = execution(wu)
        text = (ex.system_message or {}).get("userFacingText", "")
        return text if ex.state == S.FAILED and needle in text else None

    return eventually(explained, timeout=timeout, what=f"FAILED with {needle!r}",  # type: ignore[no-any-return]
                      detail=lambda: repr((execution(wu).state, execution(wu).system_message)))


def test_it_names_the_replica_pod_and_container_of_an_exit_code(cluster: Cluster, reconciler) -> None:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=2s;exit=3", backoff_limit=0)
    text = failed_text(wu, "exited with code 3")
    assert f"replica main-0 (pod xmc-{wu.experiment_id}-{wu.wid}-main-0-" in text
    assert "container main exited with code 3 (Error)" in text
    assert execution(wu).system_message["severity"] == "ERROR"


def test_it_names_a_signal(cluster: Cluster, reconciler) -> None:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=2s;exit=139", backoff_limit=0)
    text = failed_text(wu, "signal 11")
    assert "was killed by signal 11 (Error, SIGSEGV, exit code 139)" in text


def test_it_names_the_backoff_limit_with_the_number_of_failed_pods(cluster: Cluster, reconciler) -> None:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=1s;exit=1", backoff_limit=2)
    text = failed_text(wu, "BackoffLimitExceeded", timeout=120)
    assert (f"replicated job main-0 (job xmc-{wu.experiment_id}-{wu.wid}-main-0): BackoffLimitExceeded, backoff limit"
            " reached after 3 failed pod(s) (backoffLimit 2)") in text
    assert "JobSet failed (FailedJobs)" in text


def test_it_names_a_deadline(cluster: Cluster, reconciler) -> None:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=forever", active_deadline_s=3)
    text = failed_text(wu, "DeadlineExceeded")
    assert "DeadlineExceeded, active longer than its deadline (activeDeadlineSeconds 3)" in text


def test_it_names_an_image_that_cannot_be_pulled_when_the_deadline_fails_the_job(cluster: Cluster, reconciler) -> None:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=fail:ErrImagePull", active_deadline_s=5, image="ghcr.io/nope/missing:1")
    text = failed_text(wu, "DeadlineExceeded")
    assert "ghcr.io/nope/missing:1" in text and ("ErrImagePull" in text or "ImagePullBackOff" in text), text


def test_it_names_max_restarts_with_their_count(cluster: Cluster, reconciler) -> None:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=1s;exit=5", failure_policy={"maxRestarts": 1})
    text = failed_text(wu, "ReachedMaxRestarts", timeout=120)
    assert "JobSet failed after 1 restart(s) (maxRestarts 1, ReachedMaxRestarts)" in text
    assert "exited with code 5" in text


def test_it_explains_a_rejected_admission_check(make_cluster, make_reconciler) -> None:
    cluster = make_cluster(clusterQueues=CQ_WITH_CHECK, admissionChecks=[{"name": "capacity"}])
    make_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=forever")
    custom = client.custom_objects()

    def reserved() -> Any:
        items = custom.list_namespaced_custom_object(client.KUEUE_GROUP, client.KUEUE_VERSION, "default",
                                                     client.WORKLOAD_PLURAL)["items"]
        mine = [w for w in items if w["metadata"]["ownerReferences"][0]["name"] == f"xmc-{wu.experiment_id}-{wu.wid}"]
        return mine[0] if mine and (mine[0].get("status") or {}).get("admissionChecks") else None

    wl = eventually(reserved, timeout=60, what="quota reserved, check pending")
    checks = [{**wl["status"]["admissionChecks"][0], "state": "Rejected", "message": "no capacity in zone"}]
    custom.patch_namespaced_custom_object_status(client.KUEUE_GROUP, client.KUEUE_VERSION, "default",
                                                 client.WORKLOAD_PLURAL, wl["metadata"]["name"],
                                                 {"status": {"admissionChecks": checks}})

    def explained() -> str | None:
        ex = execution(wu)
        text = (ex.system_message or {}).get("userFacingText", "")
        return text if "admission check rejected" in text else None

    text = eventually(explained, timeout=60, what="the rejection explained")
    assert "capacity" in text and "no capacity in zone" in text and "DeactivatedDueToAdmissionCheck" in text
    ex = execution(wu)
    assert ex.state == S.SCHEDULING and ex.system_message["severity"] == "ERROR"


def test_it_gives_a_deactivated_workload_an_error(cluster: Cluster, reconciler) -> None:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=300s;exit=0")
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    custom = client.custom_objects()
    items = custom.list_namespaced_custom_object(client.KUEUE_GROUP, client.KUEUE_VERSION, "default",
                                                 client.WORKLOAD_PLURAL)["items"]
    wl = next(w for w in items if w["metadata"]["ownerReferences"][0]["name"] == f"xmc-{wu.experiment_id}-{wu.wid}")
    custom.patch_namespaced_custom_object(client.KUEUE_GROUP, client.KUEUE_VERSION, "default", client.WORKLOAD_PLURAL,
                                          wl["metadata"]["name"], {"spec": {"active": False}})

    def explained() -> str | None:
        ex = execution(wu)
        text = (ex.system_message or {}).get("userFacingText", "")
        return text if ex.state == S.SCHEDULING and "deactivated" in text else None

    text = eventually(explained, timeout=60, what="the deactivation explained")
    assert "will not be admitted again until reactivated" in text


# --- the pure parts, on shapes the simulator does not produce -------------------------------------


def _pod(name: str, rjob: str = "main", index: str = "0", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {explain.RJOB_LABEL: rjob, explain.JOB_INDEX_LABEL: index}},
            "spec": {"nodeName": "n-1", "containers": [{"name": "main", "image": "img:1"}]}, "status": status}


def test_it_uses_the_kubelets_signal_field_and_lists_at_most_three() -> None:
    pods = [_pod(f"p-{i}", index=str(i), containerStatuses=[{"name": "main", "restartCount": i, "state": {
        "terminated": {"exitCode": 2, "reason": "Error", "signal": 15 if i == 0 else None}}}]) for i in range(5)]
    message = explain.failure_message(None, pods)
    assert message is not None
    text = message["userFacingText"]
    assert "replica main-0 (pod p-0) container main was killed by signal 15 (Error, SIGTERM, exit code 2)" in text
    assert "(and 2 more)" in text and "after 1 restart(s)" in text


def test_it_attaches_the_last_lines_of_the_first_failed_container() -> None:
    pods = [_pod("p-0", containerStatuses=[{"name": "main", "state": {"terminated": {"exitCode": 1}}}])]
    message = explain.failure_message(None, pods, tails={("p-0", "main"): (0, ["a", "Traceback", "boom"], 1, "Error")})
    assert message is not None and message["auxiliaryInfo"] == {"stackTrace": "a\nTraceback\nboom"}
    assert "Last lines of replica main-0 (pod p-0) container main are attached" in message["userFacingText"]
