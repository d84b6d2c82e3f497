"""Every JobSet condition change records an Event (jobset pkg/controllers/jobset_controller.go
`setCondition`: reason and message of the condition, emitted after the status update; Warning for
Failed and RestartingJobSet=True, Normal for the rest), plus the failure-policy action event."""

from __future__ import annotations

from tests.simulators.cluster.fidelity.conftest import Cluster, rjob


def test_it_records_an_event_for_every_jobset_condition_change(kube_cluster: Cluster) -> None:
    # The JobSet controller and Kueue run apart, as upstream: when Kueue admits the new JobSet before the
    # JobSet controller first looks at it, the controller never sees it suspended and records neither
    # SuspendedJobs nor ResumeJobs (run 33). Its queue holds admission until the controller has seen it.
    kube_cluster.stop_policy("cpu-queue", "Hold")
    # Fails once (restart 1 heals it), then completes.
    kube_cluster.create_jobset("flaky", [rjob("main", script="pull=0s;run=2s;exit=1;heal=restarts:1")],
                          failurePolicy={"maxRestarts": 2})
    kube_cluster.eventually(lambda: any(e.reason == "SuspendedJobs" for e in kube_cluster.events("JobSet", "flaky")),
                            what="the JobSet seen suspended")
    kube_cluster.stop_policy("cpu-queue", "None")
    kube_cluster.eventually(lambda: (c := kube_cluster.cond(kube_cluster.jobset("flaky"), "Completed")) and c["status"] == "True",
                       timeout=30, what="completed after one restart")

    def seen() -> set[tuple[str, str, str]]:
        return {(e.type, e.reason, e.message) for e in kube_cluster.events("JobSet", "flaky")}

    failed_job = "flaky-main-0"
    expected = {
        ("Normal", "SuspendedJobs", "jobset is suspended"),  # created suspended by Kueue's webhook
        ("Normal", "ResumeJobs", "jobset is resumed"),
        # RestartingJobSet=True: the condition event and the action event, both Warning.
        ("Warning", "DefaultFailurePolicy", f"applying RestartJobSet failure policy action (first failed job: {failed_job})"),
        ("Warning", "RestartJobSetFailurePolicyAction", f"applying RestartJobSet failure policy action (first failed job: {failed_job})"),
        ("Normal", "JobsReady", "all jobs are ready"),  # RestartingJobSet=False/JobsReady
        ("Normal", "AllJobsCompleted", "jobset completed successfully"),
        ("Normal", "JobSetCompleted", "jobset completed successfully"),  # RestartingJobSet=False/JobSetCompleted
    }
    kube_cluster.eventually(lambda: expected <= seen(), what=f"events {sorted(expected - seen())}")
    assert all(e.source.component == "jobset-controller" or e.reporting_component for e in kube_cluster.events("JobSet", "flaky"))

    # kubectl, as a user would look at them.
    out = kube_cluster.kubectl("get", "events", "--field-selector", "involvedObject.kind=JobSet,involvedObject.name=flaky").stdout
    for reason in ("DefaultFailurePolicy", "JobsReady", "JobSetCompleted", "AllJobsCompleted"):
        assert reason in out, out


def test_it_records_the_failed_condition_as_a_warning_and_restarting_false_as_normal(kube_cluster: Cluster) -> None:
    kube_cluster.create_jobset("doomed", [rjob("main", script="pull=0s;run=2s;exit=1")], failurePolicy={"maxRestarts": 1})
    kube_cluster.eventually(lambda: (c := kube_cluster.cond(kube_cluster.jobset("doomed"), "Failed")) and c["status"] == "True",
                       timeout=30, what="failed after the restart")
    msg = "jobset failed due to reaching max number of restarts (first failed job: doomed-main-0)"
    kube_cluster.eventually(lambda: {("Warning", "ReachedMaxRestarts", msg), ("Normal", "JobSetFailed", "jobset failed")}
                       <= {(e.type, e.reason, e.message) for e in kube_cluster.events("JobSet", "doomed")},
                       what="Failed and RestartingJobSet=False events")
