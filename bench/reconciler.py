"""Benchmark: reconciler lag and database transactions per cluster change, batched vs naive.

    ./dev bench reconciler        (or: python bench/reconciler.py [--rates 100,500,2000])

A simulator (API server only: the benchmark itself plays the JobSet
controller) holds ``--jobsets`` JobSets of ours, one per work unit. A driver
thread flips their status between "active, not ready" (STARTING) and "all
ready" (RUNNING) at N changes per second for ``--seconds``, recording the
resourceVersion and time of each change. The real reconciler (watchers,
mapping, batcher, guarded service) runs in-process; its write function is
wrapped to record when each update commits and from which JobSet
resourceVersion it was computed. A change's lag is cluster change -> first
committed write computed from that resourceVersion or a newer one. Changes
no committed write covers by the end (superseded before they were observed
with no net change, or still behind when the 15 s tail wait ends) are
counted as "unwritten", not as lag.

Two variants, same run, same data: the batched reconciler
(``XMC_RECONCILER_FLUSH_INTERVAL_MS`` flushes, one transaction each, over
``--write-connections`` shards of experiments, default 2) and a
naive variant that writes every observation in its own transaction as soon
as it is seen. Targets at 500 changes/s: p99 lag under 1 s, at least 5x
fewer transactions per change than the naive variant.
"""
from __future__ import annotations

import argparse
import bisect
import statistics
import threading
import time
from typing import Any

from _django import bench_database
from _signals import exit_on_termination

NS = "default"
DEBUG = False


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def status(ready: bool) -> dict[str, Any]:
    return {"status": {"restarts": 0, "replicatedJobsStatus": [
        {"name": "main", "ready": 1 if ready else 0, "active": 1, "succeeded": 0, "failed": 0, "suspended": 0}]}}


def run_variant(variant: str, store: Any, keys: list[tuple[int, int]], rate: int, seconds: float,
                naive: bool, flush_ms: int, write_connections: int) -> dict[str, Any]:
    from k8s_bridge.reconciler.controller import Options, Reconciler
    from workunits import services

    commits: dict[str, list[tuple[int, float]]] = {}  # jobset -> [(rv, commit time)]
    lock = threading.Lock()
    transactions = 0

    def record(updates: Any) -> None:
        now = time.monotonic()
        with lock:
            for u in updates:
                rv = u.extra.get("resourceVersion")
                if rv:
                    commits.setdefault(u.extra["jobset"], []).append((int(rv), now))

    def batched_write(updates: Any) -> Any:
        nonlocal transactions
        t0 = time.monotonic()
        out = services.update_work_unit_executions(updates)
        if DEBUG:
            print(f"  flush {len(updates)} in {time.monotonic() - t0:.3f}s", flush=True)
        with lock:  # shards flush from their own threads
            transactions += 1
        record(updates)
        return out

    def naive_write(updates: Any) -> Any:
        nonlocal transactions
        out = []
        for u in updates:
            out += services.update_work_unit_executions([u])
            transactions += 1
            record([u])
        return out

    options = Options(namespaces=(NS,), flush_interval_s=0.001 if naive else flush_ms / 1000.0,
                      max_batch=1 if naive else 500, resync_s=3600, position_refresh_s=3600, watch_timeout_s=30,
                      write_connections=1 if naive else write_connections)
    rec = Reconciler(options, write=naive_write if naive else batched_write)
    rec.start()
    # settle: the initial list puts every JobSet once; wait until that is written
    settle_until = time.monotonic() + 60
    while time.monotonic() < settle_until:
        with lock:
            if len(commits) >= len(keys) and not rec.batcher.pending():
                break
        time.sleep(0.1)
    with lock:
        commits.clear()
    transactions = 0

    changes: list[tuple[str, int, float]] = []
    ready_state = {k: True for k in keys}
    stop_at = time.monotonic() + seconds
    interval = 1.0 / rate
    i = 0
    next_at = time.monotonic()
    while time.monotonic() < stop_at:
        xid, wid = keys[i % len(keys)]
        i += 1
        jobset = f"xmc-{xid}-{wid}"
        ready_state[(xid, wid)] = not ready_state[(xid, wid)]
        obj = store.patch("jobsets", NS, jobset, "merge", status(ready_state[(xid, wid)]), subresource="status")
        changes.append((jobset, int(obj["metadata"]["resourceVersion"]), time.monotonic()))
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    achieved = len(changes) / seconds
    # wait for the tail to be written
    deadline = time.monotonic() + 15
    last_rv = {}
    for jobset, rv, _ in changes:
        last_rv[jobset] = rv
    while time.monotonic() < deadline:
        with lock:
            behind = [j for j, rv in last_rv.items() if not commits.get(j) or max(r for r, _ in commits[j]) < rv]
        if not behind:
            break
        time.sleep(0.2)
    rec.stop(drain=True)

    lags: list[float] = []
    absorbed = 0
    with lock:
        table = {j: sorted(v) for j, v in commits.items()}
    for jobset, rv, t in changes:
        entries = table.get(jobset, [])
        index = bisect.bisect_left(entries, (rv, -1.0))
        if index < len(entries):
            lags.append(max(0.0, entries[index][1] - t))
        else:
            absorbed += 1
    return {
        "variant": variant, "rate": rate, "achieved": achieved, "changes": len(changes),
        "p50": percentile(lags, 0.50), "p99": percentile(lags, 0.99),
        "mean": statistics.fmean(lags) if lags else float("nan"),
        "absorbed": absorbed, "transactions": transactions,
        "tx_per_change": transactions / max(1, len(changes)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="100,500,2000")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--jobsets", type=int, default=400)
    parser.add_argument("--flush-ms", type=int, default=200)
    parser.add_argument("--write-connections", type=int, default=2,
                        help="the batcher's shards and connections (XMC_RECONCILER_WRITE_CONNECTIONS)")
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)

    with bench_database():
        import tempfile

        from django.conf import settings

        from k8s_bridge import client
        from k8s_bridge.reconciler import mapping
        from simulators.cluster.server import run_simulator
        from tests import factories

        tmp = tempfile.mkdtemp(prefix="bench-reconciler-")
        handle = run_simulator(port=0, controllers=False, kubeconfig_out=f"{tmp}/kubeconfig")
        settings.KUBECONFIG = f"{tmp}/kubeconfig"
        client.reset()
        try:
            print(f"setting up {args.jobsets} work units and JobSets ...", flush=True)
            keys: list[tuple[int, int]] = []
            for e in range((args.jobsets + 99) // 100):
                exp = factories.experiment()
                for _ in range(min(100, args.jobsets - e * 100)):
                    wu = factories.work_unit(exp)
                    keys.append((exp.id, wu.wid))
                    handle.store.create("jobsets", NS, {
                        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                        "metadata": {"name": f"xmc-{exp.id}-{wu.wid}", "namespace": NS, "labels": {
                            mapping.XID_LABEL: str(exp.id), mapping.WID_LABEL: str(wu.wid), mapping.EID_LABEL: "1"}},
                        "spec": {"replicatedJobs": [{"name": "main", "replicas": 1, "template": {"spec": {}}}]},
                    })
                    handle.store.patch("jobsets", NS, f"xmc-{exp.id}-{wu.wid}", "merge", status(True),
                                       subresource="status")
            results = []
            for rate in (int(r) for r in args.rates.split(",")):
                for naive in (False, True):
                    name = "naive" if naive else "batched"
                    print(f"rate {rate}/s, {name} ...", flush=True)
                    results.append(run_variant(name, handle.store, keys, rate, args.seconds, naive, args.flush_ms,
                                               args.write_connections))
            print()
            print(f"{'rate':>6} {'variant':>8} {'achieved':>9} {'p50 ms':>8} {'p99 ms':>8} {'unwritten':>9} "
                  f"{'tx':>7} {'tx/change':>10}")
            for r in results:
                print(f"{r['rate']:>6} {r['variant']:>8} {r['achieved']:>9.0f} {r['p50'] * 1000:>8.0f} "
                      f"{r['p99'] * 1000:>8.0f} {r['absorbed']:>9} {r['transactions']:>7} {r['tx_per_change']:>10.3f}")
            print()
            for rate in sorted({r["rate"] for r in results}):
                b = next(r for r in results if r["rate"] == rate and r["variant"] == "batched")
                n = next(r for r in results if r["rate"] == rate and r["variant"] == "naive")
                ratio = n["tx_per_change"] / max(b["tx_per_change"], 1e-9)
                print(f"{rate}/s: batched uses {ratio:.1f}x fewer transactions per change than naive; "
                      f"batched p99 lag {b['p99'] * 1000:.0f} ms vs naive {n['p99'] * 1000:.0f} ms")
        finally:
            handle.stop()
            client.reset()


if __name__ == "__main__":
    main()
