"""The pages' pure helpers: safe links, sweep columns, the roll-up bar, the words for states."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ui import present


def test_it_links_only_absolute_http_urls() -> None:
    assert present.safe_url("https://tb.example.com/run/1?x=1") == "https://tb.example.com/run/1?x=1"
    assert present.safe_url("http://host:6006") == "http://host:6006"
    for bad in ("javascript:alert(1)", " JavaScript:alert(1)", "data:text/html,<b>", "//evil.example.com",
                "/relative", "https:///no-host", "http://ex\\ample.com", "http://a\nb.com", None, 42):
        assert present.safe_url(bad) == "", bad


def test_it_splits_a_sweep_into_varying_columns_and_shared_args() -> None:
    varying, shared = present.sweep([{"lr": "0.1", "batch": "64"}, {"lr": "0.01", "batch": "64"},
                                     {"lr": "0.01", "batch": "64", "seed": "3"}])
    assert varying == ["lr", "seed"] and shared == {"batch": "64"}
    assert present.sweep([]) == ([], {})
    assert present.sweep([{"a": "1"}]) == ([], {"a": "1"})


def test_it_reads_args_and_env_from_every_job() -> None:
    executable = {"jobset": {"jobs": [
        {"name": "trainer", "spec": {"args": {"lr": 0.1}, "argsList": ["--fast"], "envVars": {"A": "1"}}},
        {"name": "eval", "spec": {"args": {"lr": "x"}, "env": [{"name": "B", "value": "2"}]}}]}}
    assert present.job_args(executable) == {"trainer.lr": "0.1", "trainer.argv[0]": "--fast", "eval.lr": "x"}
    assert present.job_env(executable) == [("trainer", "A", "1"), ("eval", "B", "2")]


def test_it_draws_the_rollup_in_a_fixed_order_with_offsets() -> None:
    bar = present.rollup({"FAILED": 1, "RUNNING": 3, "COMPLETED": 0})
    assert [(s["state"], s["count"], s["x"], s["pct"]) for s in bar] == [("RUNNING", 3, 0.0, 75.0),
                                                                          ("FAILED", 1, 75.0, 25.0)]
    assert present.rollup({}) == []


def test_it_says_why_a_unit_is_not_running() -> None:
    queued = {"scheduling_information": {"auxiliaryInfo": {"queueInfo": {"positionInQueue": 3,
                                                                          "totalWorkloadsInQueue": 9}}}}
    assert present.why_not_running("SCHEDULING", queued, "gpu") == "Waiting for quota in gpu: position 3 of 9"
    assert "paused" in present.why_not_running("SCHEDULING_PAUSED", {}, "")
    evicted = {"system_message": {"userFacingText": "Evicted (Preempted)"}}
    assert present.why_not_running("DESCHEDULING", evicted, "") == "Preempted by a higher-priority workload"
    assert present.why_not_running("RUNNING", {}, "q") == ""


def test_it_prints_durations_compactly() -> None:
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert [present.duration(t, t + timedelta(seconds=s)) for s in (5, 65, 3720, 90000)] == \
        ["5s", "1m05s", "1h02m", "1d01h"]
    assert present.duration(None, t) == ""


def test_it_estimates_a_start_from_the_queues_admission_gaps() -> None:
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
    # Ten admissions 60 s apart, the last one just now: mean gap 60 s, no spread.
    steady = [now - timedelta(seconds=60 * k) for k in range(10)]
    assert present.estimate_start(3, steady, now) == (180.0, 180.0)
    # Gaps alternating 30 s and 90 s (mean 60, sample sd 31.62...), the last admission 20 s ago:
    # centre 4 * 60 - 20 = 220, half-width 1.2816 * sd * sqrt(4).
    times, t = [], now - timedelta(seconds=20)
    for k in range(10):
        times.append(t)
        t -= timedelta(seconds=30 if k % 2 == 0 else 90)
    times.append(t)
    sd = (10 * 30 ** 2 / 9) ** 0.5  # ten gaps, each 30 s from the mean
    low, high = present.estimate_start(4, times, now)  # type: ignore[misc]
    assert abs(low - (220 - 1.2816 * sd * 2)) < 1e-6 and abs(high - (220 + 1.2816 * sd * 2)) < 1e-6
    assert present.estimate_words((low, high), 11) == (
        "Estimated start in 2 min to 5 min (from the queue's last 11 admissions)")


def test_it_gives_no_estimate_rather_than_a_guess() -> None:
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
    few = [now - timedelta(seconds=60 * k) for k in range(present.ESTIMATE_MIN_ADMISSIONS - 1)]
    assert present.estimate_start(2, few, now) is None  # not enough history
    old = [now - timedelta(seconds=present.ESTIMATE_WINDOW_S + 60 * k) for k in range(1, 20)]
    assert present.estimate_start(2, old, now) is None  # nothing recent
    stalled = [now - timedelta(seconds=600 + 60 * k) for k in range(12)]
    assert present.estimate_start(2, stalled, now) is None  # 10 min without one, usual gap 1 min
    assert present.estimate_words(None, 0) == ""
    queued = {"scheduling_information": {"auxiliaryInfo": {"queueInfo": {"positionInQueue": 2}}}}
    assert present.why_not_running("SCHEDULING", queued, "q", "Estimated start within 2 min") == (
        "Waiting for quota in q: position 2. Estimated start within 2 min")
