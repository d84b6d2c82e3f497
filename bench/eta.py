"""How good is the pages' estimated start? Measured against the simulator (issue 38, item 5).

``./dev bench eta`` (or ``python bench/eta.py``): starts the whole system
(``scripts/run_all.py`` on a throw-away database), launches waves of work
units into the 4-CPU ``demo-queue`` -- jobs of 8, 20 and 40 s, LOW, NORMAL and
HIGH priority (a HIGH one preempts a LOW one) -- and every 2 s asks, for each
unit waiting with a queue position, what the pages would show
(``workunits.eta.estimate_start`` over ``workunits.eta.recent_admissions``: the
code path of the pages and ``xmc why``). When a unit is admitted
(its status history leaves SCHEDULING), every estimate made for it is
compared with the real start:

* error of one estimate = |estimated start - real start| / real remaining wait
  (the wait from the moment of the estimate; the centre of the printed range);
* the method's score: the median of those errors; the share of waiting
  units that were shown an estimate at least once.

Baseline, measured in the same run: a constant guess, the mean wait of all
units (an oracle no page could know), so the ratio says whether the method
beats knowing the average. ``workunits.eta.ESTIMATE_MEASURED_ERROR`` records the
figure; the pages show an estimate only while it is within
``ESTIMATE_MAX_ERROR`` (25 %) of the real wait.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _django import bench_database  # noqa: E402
from _signals import exit_on_termination  # noqa: E402
from logs_follow import call, start_system  # noqa: E402

#: (run seconds, priority) of one wave; every unit asks for 1 CPU of the 4.
WAVE = [(8, "NORMAL"), (20, "LOW"), (40, "NORMAL"), (8, "HIGH"), (20, "NORMAL"), (8, "LOW"),
        (40, "LOW"), (20, "HIGH"), (8, "NORMAL"), (20, "NORMAL")]


def unit(run_s: int, priority: str) -> dict[str, Any]:
    return {"priority": priority, "executable": {
        "schedulingConstraints": {"queueName": "demo-queue"},
        "jobset": {"jobs": [{"name": "main", "replicas": 1,
                             "annotations": {"sim.xmc.dev/script": f"pull=0s;run={run_s}s;exit=0"},
                             "spec": {"dockerImage": "gcr.io/xmc-demo/trainer:v1",
                                      "resources": {"cpuResources": {"cpuMillicores": 1000,
                                                                     "memoryBytes": str(1 << 30)}}}}]}}}


def estimates_now(xid: int) -> list[tuple[int, float, float]]:
    """(wid, seconds from now the pages' estimate centres on, now) for every waiting unit shown one."""
    from django.utils import timezone

    from workunits import eta
    from workunits.models import WorkUnitExecution

    now = timezone.now()
    rows = list(WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, execution_state="ACTIVE",
                                                 state="SCHEDULING")
                .values_list("work_unit__wid", "scheduling_information"))
    admissions = eta.recent_admissions(["demo-queue"], eta.ESTIMATE_WINDOW_S).get("demo-queue", [])
    out = []
    for wid, info in rows:
        position = eta.queue_position({"scheduling_information": info})
        if position is None:
            continue
        estimate = eta.estimate_start(position, admissions, now)
        if estimate is not None:
            out.append((wid, (estimate[0] + estimate[1]) / 2, now.timestamp()))
    return out


def admitted_at(xid: int) -> dict[int, tuple[float, float]]:
    """wid -> (when its execution was created, when it first reached STARTING or RUNNING).

    From SCHEDULING, or straight from INITIALIZING when the reconciler first saw it admitted."""
    from workunits.models import StatusHistory

    out: dict[int, tuple[float, float]] = {}
    rows = (StatusHistory.objects.filter(execution__work_unit__experiment_id=xid, to_state__in=("STARTING", "RUNNING"))
            .order_by("time").values_list("execution__work_unit__wid", "time", "execution__create_time"))
    for wid, when, created in rows:
        out.setdefault(int(wid), (created.timestamp(), when.timestamp()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waves", type=int, default=4, help="waves of 10 units, one every --gap seconds")
    parser.add_argument("--gap", type=float, default=60.0)
    options = parser.parse_args()
    exit_on_termination()
    with bench_database():
        from django.db import connection

        db = connection.settings_dict
        database_url = f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        proc, exports = start_system(database_url, tempfile.mkdtemp(prefix="xmc-bench-eta-"))
        try:
            api, token = exports["XMC_API_URL"], exports["XMC_AUTH_TOKEN"]
            xid = int(call(api, token, "POST", "/v1/experiments", {"title": "eta bench"})["name"].rsplit("/")[-1])
            made: dict[int, list[tuple[float, float]]] = {}  # wid -> [(when, estimated start)]
            launched = 0
            next_wave = time.monotonic()
            total = options.waves * len(WAVE)
            deadline = time.monotonic() + options.waves * options.gap + 600
            while time.monotonic() < deadline:
                if launched < total and time.monotonic() >= next_wave:
                    for run_s, priority in WAVE:
                        call(api, token, "POST", f"/v1/experiments/{xid}/workUnits", unit(run_s, priority))
                    launched += len(WAVE)
                    next_wave += options.gap
                for wid, ahead, now in estimates_now(xid):
                    made.setdefault(wid, []).append((now, now + ahead))
                if launched >= total and len(admitted_at(xid)) >= total:
                    break
                time.sleep(2.0)
            starts = admitted_at(xid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    waits = [start - created for created, start in starts.values()]
    mean_wait = statistics.mean(waits) if waits else 0.0
    errors, baseline = [], []
    for wid, guesses in made.items():
        if wid not in starts:
            continue
        created, start = starts[wid]
        for when, guess in guesses:
            remaining = start - when
            if remaining <= 2.0:  # admitted between the read and now: nothing left to estimate
                continue
            errors.append(abs(guess - start) / remaining)
            baseline.append(abs(created + mean_wait - start) / remaining)
    waited = [wid for wid, (created, start) in starts.items() if start - created > 2.0]
    shown = [wid for wid in waited if wid in made]
    median = statistics.median(errors) if errors else float("nan")
    base = statistics.median(baseline) if baseline else float("nan")
    print(f"Estimated start vs real start, {len(starts)} units in demo-queue (4 CPUs; 8/20/40 s jobs;"
          f" LOW/NORMAL/HIGH), {datetime.now():%Y-%m-%d}")
    print("| method | median absolute error (share of the real remaining wait) | estimates | units shown one | vs baseline |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| queue admissions (workunits.eta.estimate_start) | {median:.0%} | {len(errors)} |"
          f" {len(shown)} of {len(waited)} waiting ({(len(shown) / len(waited) if waited else 0):.0%}) |"
          f" {median / base if base else float('nan'):.2f}x |")
    print(f"| baseline: the mean wait ({mean_wait:.0f} s), known in advance | {base:.0%} | {len(baseline)} | | 1.00x |")
    print(f"rule (ESTIMATE_MAX_ERROR 25%): {'shown' if median <= 0.25 else 'not shown'}")


if __name__ == "__main__":
    main()
