"""One headline per failure or wait, short first, no UIDs (issue 38, item 4): ``workunits.headline``.

The failure texts are the reconciler's own (``k8s_bridge.reconciler.explain``),
as it writes them for the cases the issue names.
"""
from __future__ import annotations

from workunits.headline import describe, explain, failure, headline

UID = "3f0c2d1e-9a7b-4c5d-8e6f-0a1b2c3d4e5f"


def error(text: str) -> dict[str, str]:
    return {"severity": "ERROR", "userFacingText": text}


def test_it_says_exit_code_and_how_often_against_the_retry_limit() -> None:
    text = ("JobSet failed (FailedJobs): jobset xmc-7-1 failed. replicated job train (job xmc-7-1-train-0):"
            " BackoffLimitExceeded, backoff limit reached after 2 failed pod(s) (backoffLimit 1). replica train-0"
            " (pod xmc-7-1-train-0-0-abcde) container main exited with code 1 (Error)")
    assert headline("FAILED", error(text), None) == "exited with code 1, twice (retry limit 1)"


def test_it_names_out_of_memory_and_the_replica() -> None:
    text = "Out of memory (OOMKilled): replica train-0 (pod xmc-7-1-train-0-0-abcde) container main"
    assert headline("FAILED", error(text), None) == "out of memory (OOMKilled) in train-0"


def test_it_gives_the_queue_position_of_a_waiting_unit() -> None:
    scheduling = {"userFacingText": f"couldn't assign flavors to pod set main: insufficient quota (workload {UID})",
                  "auxiliaryInfo": {"queueInfo": {"positionInQueue": 3, "totalWorkloadsInQueue": 7}}}
    assert headline("SCHEDULING", None, scheduling, "demo-queue") == "waiting for quota in demo-queue: position 3 of 7"


def test_it_says_preempted_not_queued() -> None:
    scheduling = {"userFacingText": f"Preempted to accommodate a workload (UID: {UID}) due to prioritization"}
    assert headline("SCHEDULING", None, scheduling, "demo-queue") == "preempted by a higher-priority workload"


def test_it_shows_the_actuators_retry_and_dead_letter_in_a_line() -> None:
    warning = {"severity": "WARNING", "userFacingText": "the cluster refused the JobSet 3 times: Kubernetes API 500"
                                                        " Internal Server Error; retrying in 20 s"}
    assert headline("INITIALIZING", warning, None).endswith("retrying in 20 s")
    dead = error("the cluster refused the JobSet 9 times over 2m44s: Kubernetes API 500 Internal Server Error: boom;"
                 " an operator can re-queue it")
    assert headline("FAILED", dead, None) == ("the cluster refused the JobSet 9 times over 2m44s: Kubernetes API 500"
                                              " Internal Server Error: boom")


def test_it_never_shows_a_uid_and_stays_one_short_line() -> None:
    text = f"Workload {UID} was deactivated. " + "x" * 400
    line = failure(text)
    assert UID not in line and len(line) <= 120


def test_it_has_nothing_to_say_about_a_unit_that_runs() -> None:
    assert headline("RUNNING", None, None, "q") == ""
    assert headline("COMPLETED", None, None, "q") == ""


def test_it_reads_the_case_once_into_the_line_and_a_structured_reason() -> None:
    text = ("JobSet failed (FailedJobs): replicated job train: BackoffLimitExceeded, backoff limit reached after"
            " 2 failed pod(s) (backoffLimit 1). replica train-0 container main exited with code 3 (Error)")
    assert explain("FAILED", error(text), None) == ("exited with code 3, twice (retry limit 1)", {
        "code": "FAILED", "cause": "EXIT_CODE", "exitCode": 3, "failures": 2, "retryLimit": 1})
    queued = {"auxiliaryInfo": {"queueInfo": {"positionInQueue": 3, "totalWorkloadsInQueue": 7}}}
    assert explain("SCHEDULING", None, queued, "demo-queue")[1] == {
        "code": "WAITING_FOR_QUOTA", "queue": "demo-queue", "positionInQueue": 3, "totalInQueue": 7}
    assert explain("RUNNING", None, None, "q") == ("", {"code": "RUNNING"})


def test_it_makes_the_sentence_the_line_capitalised_with_a_queued_units_estimate_only() -> None:
    queued = {"auxiliaryInfo": {"queueInfo": {"positionInQueue": 2}}}
    assert describe("SCHEDULING", None, queued, "q", "Estimated start within 2 min")["sentence"] == (
        "Waiting for quota in q: position 2. Estimated start within 2 min")
    preempted = {"userFacingText": "Preempted to accommodate a workload", **queued}
    said = describe("SCHEDULING", None, preempted, "q", "Estimated start within 2 min")
    assert said["sentence"] == "Preempted by a higher-priority workload" and said["reason"] == {"code": "PREEMPTED"}
    assert describe("COMPLETED", None, None)["sentence"] == ""
