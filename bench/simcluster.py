"""Benchmark of the cluster simulator: watch latency and resource use under load.

Run from the project root (not part of the test suite):

    .venv/bin/python bench/simcluster.py [--jobsets 1000] [--pods-per-jobset 4] [--speed 20]

It starts the simulator (`simulators.cluster.server.run_simulator`, with
controllers) in a separate process, which records the wall-clock commit time
of every resourceVersion.  Then:

1. Baseline: one bare watch on an otherwise idle simulator receives 200 Lease
   updates.
2. Load: four watches (JobSets, Jobs, Pods, Workloads: what the reconciler
   holds) stay open while the JobSets are created, each with `pods-per-jobset`
   pods scripted `pull=1s;run=10s;exit=0`, queued through Kueue, and run to
   completion.

The watch delivery latency of an event is the client's receipt time minus the
simulator's commit time for that resourceVersion (same machine, same clock).
Simulator CPU and RSS are sampled with psutil.  Targets: p99 < 200 ms,
RSS < 1 GiB.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import yaml

from _signals import exit_on_termination

ROOT = Path(__file__).resolve().parents[1]
_RV_RE = re.compile(rb'"resourceVersion":"(\d+)"')


# ---------------------------------------------------------------------------
# Simulator side (runs in the child process)


def serve(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from simulators.cluster.server import run_simulator

    commits: dict[int, float] = {}

    def record(event_type: str, rt: Any, obj: dict[str, Any]) -> None:
        commits[int(obj["metadata"]["resourceVersion"])] = time.time()

    handle = run_simulator(port=0, speed=args.speed, kubeconfig_out=args.kubeconfig_out)
    handle.store.add_listener(record)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    while not done.wait(0.2):
        pass
    handle.stop()
    with open(args.commit_log, "w") as fh:
        json.dump(commits, fh)


# ---------------------------------------------------------------------------
# Client side


class Watcher(threading.Thread):
    """A raw chunked watch stream; records (receipt time, rv, type) per event."""

    def __init__(self, base: str, path: str, on_line: Any = None):
        super().__init__(daemon=True)
        split = urlsplit(base)
        self.conn = http.client.HTTPConnection(split.hostname or "127.0.0.1", split.port, timeout=3600)
        self.path = path
        self.received: list[tuple[float, int]] = []
        self.on_line = on_line
        self.ready = threading.Event()

    def run(self) -> None:
        self.conn.request("GET", self.path, headers={"Accept": "application/json"})
        resp = self.conn.getresponse()
        self.ready.set()
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                now = time.time()
                m = _RV_RE.search(line)
                if m:
                    self.received.append((now, int(m.group(1))))
                if self.on_line is not None:
                    self.on_line(line)
        except (OSError, http.client.HTTPException):
            return

    def close(self) -> None:
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(2)
        except OSError:
            pass


def request(base: str, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
    split = urlsplit(base)
    conn = http.client.HTTPConnection(split.hostname or "127.0.0.1", split.port, timeout=60)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": ctype, "Accept": "application/json"})
    resp = conn.getresponse()
    out = json.loads(resp.read() or b"null")
    conn.close()
    if resp.status >= 300:
        raise RuntimeError(f"{method} {path}: {resp.status} {out}")
    return out


def jobset(name: str, pods: int) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "default"}},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": pods, "template": {"spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"sim.xmc.dev/script": "pull=1s;run=10s;exit=0"}},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "main", "image": "busybox:1.36",
                                         "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]},
            }}}}]},
    }


class Sampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.stop_event = threading.Event()
        self.peak_rss = 0
        self.samples: list[tuple[float, float, int]] = []  # (time, cpu seconds, rss)

    def cpu_seconds(self) -> float:
        t = self.proc.cpu_times()
        return float(t.user + t.system)

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            try:
                rss = self.proc.memory_info().rss
                self.samples.append((time.time(), self.cpu_seconds(), rss))
                self.peak_rss = max(self.peak_rss, rss)
            except psutil.Error:
                return


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(pct / 100.0 * (len(ordered) - 1)))))
    return ordered[k]


def latencies(watchers: list[Watcher], commits: dict[int, float]) -> list[float]:
    out = []
    for w in watchers:
        for received, rv in w.received:
            committed = commits.get(rv)
            if committed is not None:
                out.append(max(0.0, received - committed) * 1000.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobsets", type=int, default=1000)
    parser.add_argument("--pods-per-jobset", type=int, default=4)
    parser.add_argument("--speed", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8, help="concurrent creating clients")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig-out", help=argparse.SUPPRESS)
    parser.add_argument("--commit-log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)
    if args.serve:
        serve(args)
        return

    tmp = Path(tempfile.mkdtemp(prefix="simbench-"))
    kubeconfig, commit_log = tmp / "kubeconfig", tmp / "commits.json"
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--speed", str(args.speed),
         "--kubeconfig-out", str(kubeconfig), "--commit-log", str(commit_log)],
        cwd=ROOT, stdout=open(tmp / "sim.log", "w"), stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 30
        while not kubeconfig.exists():
            if time.time() > deadline or child.poll() is not None:
                sys.exit(f"simulator did not start; see {tmp / 'sim.log'}")
            time.sleep(0.1)
        base = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        sampler = Sampler(child.pid)
        sampler.start()
        time.sleep(1.0)

        # 1. Baseline: bare watch on an idle simulator.
        lease_path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
        rv = request(base, "GET", lease_path)["metadata"]["resourceVersion"]
        baseline = Watcher(base, f"{lease_path}?watch=true&resourceVersion={rv}")
        baseline.start()
        baseline.ready.wait(10)
        request(base, "POST", lease_path, {"metadata": {"name": "bench"}, "spec": {"holderIdentity": "0"}})
        idle_cpu0, idle_t0 = sampler.cpu_seconds(), time.time()
        for i in range(200):
            request(base, "PATCH", f"{lease_path}/bench", {"spec": {"holderIdentity": str(i + 1)}},
                    "application/merge-patch+json")
            time.sleep(0.005)
        time.sleep(0.5)
        idle_cpu = (sampler.cpu_seconds() - idle_cpu0) / (time.time() - idle_t0)

        # 2. Load: reconciler-like watches while JobSets run to completion.
        completed: set[bytes] = set()
        total = args.jobsets

        def on_jobset(line: bytes) -> None:
            if b'"terminalState":"Completed"' in line:
                m = re.search(rb'"name":"(bench-\d+)"', line)
                if m:
                    completed.add(m.group(1))

        watchers = []
        for path, hook in (("/apis/jobset.x-k8s.io/v1alpha2/jobsets", on_jobset), ("/apis/batch/v1/jobs", None),
                           ("/api/v1/pods", None), ("/apis/kueue.x-k8s.io/v1beta2/workloads", None)):
            list_rv = request(base, "GET", path)["metadata"]["resourceVersion"]
            w = Watcher(base, f"{path}?watch=true&allowWatchBookmarks=true&resourceVersion={list_rv}", hook)
            w.start()
            w.ready.wait(10)
            watchers.append(w)

        load_cpu0, t0 = sampler.cpu_seconds(), time.time()
        create_path = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(lambda i: request(base, "POST", create_path, jobset(f"bench-{i}", args.pods_per_jobset)),
                          range(total)))
        created_s = time.time() - t0
        while len(completed) < total and time.time() - t0 < args.timeout:
            time.sleep(0.2)
        run_s = time.time() - t0
        load_cpu = sampler.cpu_seconds() - load_cpu0
        time.sleep(0.5)

        sampler.stop_event.set()
    finally:  # the simulator goes with us, whatever ended the run
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
        child.wait(timeout=120)
    for w in [baseline, *watchers]:
        w.close()
    commits = {int(k): v for k, v in json.loads(commit_log.read_text()).items()}

    base_lat = latencies([baseline], commits)
    load_lat = latencies(watchers, commits)
    b50, b99 = percentile(base_lat, 50), percentile(base_lat, 99)
    l50, l99 = percentile(load_lat, 50), percentile(load_lat, 99)
    peak_mib = sampler.peak_rss / 2**20
    print(f"simulator bench: {total} JobSets x {args.pods_per_jobset} pods at speed {args.speed:g}")
    print(f"  completed          {len(completed)}/{total} in {run_s:.1f} s (all created after {created_s:.1f} s)")
    print(f"  watch events       baseline {len(base_lat)}, load {len(load_lat)} "
          f"({len(load_lat) / max(run_s, 1e-9):.0f}/s over 4 watches)")
    print(f"  latency baseline   p50 {b50:.2f} ms  p99 {b99:.2f} ms   (bare watch, idle simulator)")
    print(f"  latency under load p50 {l50:.2f} ms  p99 {l99:.2f} ms   (ratio to baseline: "
          f"p50 x{l50 / b50 if b50 else float('nan'):.1f}, p99 x{l99 / b99 if b99 else float('nan'):.1f})")
    print(f"  simulator CPU      {load_cpu:.1f} s over the run ({100 * load_cpu / max(run_s, 1e-9):.0f}% of one core; "
          f"idle/baseline {100 * idle_cpu:.0f}%)")
    print(f"  simulator RSS      peak {peak_mib:.0f} MiB")
    ok = l99 < 200 and peak_mib < 1024 and len(completed) == total
    print(f"  targets (p99 < 200 ms, RSS < 1 GiB, all completed): {'MET' if ok else 'NOT MET'}")
    print(f"  logs: {tmp}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
