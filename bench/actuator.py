"""Benchmark: committed work units to JobSets through the actuator.

    ./dev bench actuator        (or: python bench/actuator.py [--work-units 500])

In one run, against one in-process simulator (API only, no controllers):

* baseline: N JobSet manifests created with direct
  ``create_namespaced_custom_object`` calls from 2 threads;
* drain: N work units committed while no worker runs, then the worker
  starts: JobSets/s from its first JobSet to its last (the actuator's capacity);
* live: N work units created through ``workunits.services.create_work_unit``
  (one experiment), paced at ``--live-rate`` per second (default half the
  drain rate, so the worker keeps up), while one
  ``celery -A xmc worker --concurrency 2`` runs;
  each commit hands its operation to the outbox, Redis, a worker, the
  simulator. Latency is commit (the on-commit hand-over) to the JobSet's
  ADDED event on a watch; throughput is N over first commit to last JobSet.

Prints JobSets/s of each, the drain/baseline ratio, and latency p50/p99 of the live run.
Targets: p99 <= 1 s, throughput >= 0.5x the baseline.
Uses ``REDIS_URL`` (its db is flushed) and ``DATABASE_URL``'s server.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

from _django import ROOT, bench_database
from _signals import exit_on_termination


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-units", type=int, default=500)
    parser.add_argument("--live-rate", type=float, default=0.0,
                        help="creates per second in the live run (default: half the measured drain rate)")
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)
    n = args.work_units

    with bench_database(), tempfile.TemporaryDirectory() as tmp:
        import redis
        from django.conf import settings
        from django.db import connection

        from k8s_bridge import client
        from jobsets.contract import Stamp
        from jobsets.builder import build_jobset
        from tests import factories
        from workunits import outbox, services

        # The simulator in its own process, as in production (a cluster is not in our process).
        kubeconfig = Path(tmp) / "kubeconfig"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        sim = subprocess.Popen([sys.executable, "-m", "simulators.cluster", "--port", str(port),
                                "--kubeconfig-out", str(kubeconfig), "--no-controllers"],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while not kubeconfig.exists():
            if time.monotonic() > deadline or sim.poll() is not None:
                raise SystemExit("the simulator did not start")
            time.sleep(0.1)
        time.sleep(0.5)
        settings.KUBECONFIG = str(kubeconfig)
        client.reset()
        api = client.custom_objects()
        ns = settings.XMC_K8S_NAMESPACE
        redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()

        # --- baseline: direct creates ---------------------------------------------------
        manifests = []
        for i in range(n):
            m = build_jobset(factories.executable(), Stamp(xid=10**12, wid=i + 1, eid=1, last_edit_ns=1), namespace=ns)
            manifests.append(m)
        started = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda m: api.create_namespaced_custom_object(
                client.JOBSET_GROUP, client.JOBSET_VERSION, ns, client.JOBSET_PLURAL, m), manifests))
        baseline_rate = n / (time.perf_counter() - started)

        # --- actuator ---------------------------------------------------------------------
        seen: dict[str, float] = {}
        stop = threading.Event()

        def watch() -> None:
            try:
                _watch()
            except Exception:  # the simulator stops under the stream at the end
                if not stop.is_set():
                    raise

        def _watch() -> None:
            w = client.watch()
            rv = api.list_namespaced_custom_object(client.JOBSET_GROUP, client.JOBSET_VERSION, ns,
                                                   client.JOBSET_PLURAL)["metadata"]["resourceVersion"]
            for event in w.stream(api.list_namespaced_custom_object, client.JOBSET_GROUP, client.JOBSET_VERSION,
                                  ns, client.JOBSET_PLURAL, resource_version=rv, timeout_seconds=600):
                if event["type"] == "ADDED":
                    seen.setdefault(event["object"]["metadata"]["name"], time.time())
                if stop.is_set():
                    w.stop()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        time.sleep(0.5)

        db = connection.settings_dict
        env = dict(os.environ, DATABASE_URL=f"postgres://{db['USER']}@{quote(db['HOST'] or '127.0.0.1', safe='')}:{db['PORT'] or 5432}/{db['NAME']}",
                   KUBECONFIG=str(kubeconfig), CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
                   REDIS_URL=settings.CELERY_BROKER_URL, XMC_LOG_LEVEL="WARNING")
        worker_argv = (
            [sys.executable, "-m", "celery", "-A", "xmc", "worker", "-Q", "actuator", "--concurrency", "2",
             "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"])

        worker_proc: list[subprocess.Popen[bytes]] = []

        def start_worker() -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(worker_argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                    stderr=open(Path(tmp) / "worker.log", "ab"), start_new_session=True)
            worker_proc[:] = [proc]
            return proc

        def wait_for(names: list[str], what: str) -> None:
            deadline = time.monotonic() + 600
            while not all(name in seen for name in names):
                if time.monotonic() > deadline or (worker_proc and worker_proc[0].poll() is not None):
                    log_tail = (Path(tmp) / "worker.log").read_text(errors="replace")[-3000:]
                    raise SystemExit(f"{what}: only {sum(nm in seen for nm in names)}/{len(names)} JobSets "
                                     f"appeared; the worker's log ends:\n{log_tail}")
                time.sleep(0.02)

        # --- drain: N committed while no worker runs, then one worker (2 processes) starts ---
        exp = factories.experiment()
        backlog = [f"xmc-{exp.id}-{services.create_work_unit(exp.id, factories.work_unit_message()).work_unit.wid}"
                   for _ in range(n)]
        worker = start_worker()
        try:
            wait_for(backlog, "drain")
            first, last = min(seen[nm] for nm in backlog), max(seen[nm] for nm in backlog)
            drain_rate = (n - 1) / (last - first)
            # Warm-up: the worker is consuming once one JobSet of ours appears.
            exp = factories.experiment()
            services.create_work_unit(exp.id, factories.work_unit_message())  # on_commit runs: autocommit
            deadline = time.monotonic() + 120
            while f"xmc-{exp.id}-1" not in seen:
                if time.monotonic() > deadline:
                    raise SystemExit("the worker never created the warm-up JobSet; see its log")
                time.sleep(0.05)

            committed: dict[int, float] = {}
            real_deliver = outbox.deliver_committed

            def timed_deliver(ops: list[Any], notify_when: str | None = None) -> None:
                now = time.time()
                for op in ops:
                    committed[op.id] = now
                real_deliver(ops, notify_when=notify_when)

            outbox.deliver_committed = timed_deliver  # type: ignore[assignment]
            exp = factories.experiment()
            wids = {}
            # Paced below the drain capacity: the latency of a live system, not of a queue
            # growing because creates outran the worker.
            live_rate = args.live_rate or drain_rate / 2
            live_start = time.monotonic()
            for i in range(n):
                pause = live_start + i / live_rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                op = services.create_work_unit(exp.id, factories.work_unit_message())
                wids[op.id] = op.work_unit.wid
            outbox.deliver_committed = real_deliver  # type: ignore[assignment]
            names = {op_id: f"xmc-{exp.id}-{wid}" for op_id, wid in wids.items()}
            wait_for(list(names.values()), "live")
        finally:
            stop.set()
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
            os.killpg(sim.pid, signal.SIGTERM)
            sim.wait(timeout=60)
        latencies = [seen[names[op_id]] - committed[op_id] for op_id in names]
        span = max(seen[nm] for nm in names.values()) - min(committed.values())
        rate = n / span
        print(f"direct create_namespaced_custom_object (2 threads): {baseline_rate:7.1f} JobSets/s")
        print(f"actuator draining a backlog of {n} (2 processes):  {drain_rate:7.1f} JobSets/s  "
              f"= {drain_rate / baseline_rate:.2f}x the baseline (target >= 0.5x)")
        print(f"live, creates through the services paced at {live_rate:.1f}/s: {rate:7.1f} JobSets/s")
        print(f"commit -> JobSet latency: p50 {statistics.median(latencies) * 1000:.0f} ms, "
              f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms (target p99 <= 1000 ms)")


if __name__ == "__main__":
    main()
