"""Benchmark of the simulated controllers (not collected by pytest).

Creates N JobSets of 2 replicated-job replicas x 2 pods (4 pods each) in the
default LocalQueue, with the default pod script (`pull=1s;run=10s;exit=0`),
on an in-process Store at a given clock speed, and reports how long it takes
until every JobSet is Completed, plus CPU time and the controllers' counters.

    ./dev bench sim_controllers    (or: python bench/sim_controllers.py --jobsets 1000 --speed 20)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import resource
import time

from simulators.cluster.clock import SimClock
from simulators.cluster.controllers import start_controllers
from simulators.cluster.store import Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobsets", type=int, default=1000)
    parser.add_argument("--speed", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    # Baseline in the same run: a tenth of the load. CPU per JobSet should
    # not grow with the number of JobSets (no O(n^2) per event).
    small = run(max(1, args.jobsets // 10), args.speed, args.timeout)
    full = run(args.jobsets, args.speed, args.timeout)
    print(f"cpu per jobset: {small * 1000:.1f} ms at {max(1, args.jobsets // 10)} jobsets (baseline), "
          f"{full * 1000:.1f} ms at {args.jobsets}: ratio {full / small:.2f}x (1.0 = linear)")


def run(jobsets: int, speed: float, timeout: float) -> float:
    """Run ``jobsets`` to completion; print the figures; return CPU seconds per JobSet."""
    clock = SimClock(speed=speed)
    store = Store(clock=clock.now)
    ctrls = start_controllers(store, clock)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    for i in range(jobsets):
        store.create("jobsets", "default", {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": f"bench-{i}", "namespace": "default",
                         "labels": {"kueue.x-k8s.io/queue-name": "cpu-queue"}},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {
                "parallelism": 2, "completions": 2, "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": "main", "image": "busybox:1.36", "resources": {"requests": {"cpu": "100m"}}}]}}}}}]},
        })
    created = time.monotonic() - t0
    done = 0
    while time.monotonic() - t0 < timeout:
        done = sum(1 for js in ctrls.cache.list("jobsets") if (js.get("status") or {}).get("terminalState") == "Completed")
        if done == jobsets:
            break
        time.sleep(0.25)
    wall = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    pods = len(store.list("pods")[0])
    events = len(store.list("events")[0])
    print(f"jobsets={jobsets} speed={speed} created_in={created:.1f}s completed={done} "
          f"wall={wall:.1f}s cpu={cpu:.1f}s sim_elapsed={wall * speed:.0f}s pods={pods} events={events} "
          f"rv={store.resource_version} cycles={ctrls.scheduler.cycles} "
          + " ".join(f"{c.name}={c.reconciles}/{c.errors}err" for c in ctrls.controllers))
    ctrls.stop()
    clock.stop()
    return cpu / jobsets


if __name__ == "__main__":
    main()
