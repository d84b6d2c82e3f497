"""One headline per failure or wait, short first, no UIDs (issue 38, item 4): ``workunits.headline``.

The failure texts are the reconciler's own (``k8s_bridge.reconciler.explain``),
as it writes them for the cases the issue names.
"""
from __future__ import annotations

from workunits.headline import failure, headline

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
