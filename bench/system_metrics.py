"""Benchmark: one system metrics collection cycle for 1,000 running executions x 8 GPUs.

    ./dev bench system_metrics      (or: python bench/system_metrics.py [--executions 1000] [--gpus 8] [--cycles 5])

On a throw-away database with ``--executions`` RUNNING executions (a tenth of
them with idle GPUs, running for longer than ``XMC_IDLE_GPU_AFTER_S``), a real
Prometheus (Debian's package, scripts/prometheus.py) scrapes an exporter that
serves the simulator's DCGM and cAdvisor text (simulators/cluster/podmetrics.py)
for one pod per execution with ``--gpus`` GPUs (8,000 GPU series at the default).
Measured in the same run:

1. **Baseline: the raw PromQL fetch** (`metrics.system.fetch`: the five instant
   queries every cycle asks, at once over HTTP, the answers parsed), the least
   any collector that asks Prometheus pays.
2. **The cycle** (`metrics.system.collect`): running executions read, the fetch,
   the join, the idle window's query for the executions that may be idle (the
   tenth with idle GPUs), one ``write_points_many`` for every execution (4 + one
   per GPU points each), the advisories. Each cycle is a new interval (new
   steps). Wall time (target ≤ 2 s) and this process' CPU as a share of one core
   at the default 15 s interval (target ≤ 20%), with Postgres' CPU for the cycle
   beside it. Prometheus here holds a minute or two of samples, not a whole
   idle window (15 min): the window's query costs it more on a real cluster.

Ratios: the cycle against the fetch.
"""
from __future__ import annotations

import argparse
import http.server
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _django import ROOT, bench_database  # noqa: E402
from _signals import exit_on_termination

# bench/metrics.py is beside this file, and this folder is on the path: load the app package under the
# name `metrics` first, or Django's `import metrics` would find that script.
_spec = importlib.util.spec_from_file_location("metrics", ROOT / "metrics" / "__init__.py",
                                               submodule_search_locations=[str(ROOT / "metrics")])
assert _spec is not None and _spec.loader is not None
sys.modules["metrics"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["metrics"])
sys.path.insert(0, str(ROOT / "scripts"))

INTERVAL_S = 15.0


class Exporter:
    """The simulator's DCGM / cAdvisor text for ``pods`` synthetic running pods, on a local port."""

    def __init__(self, pods: list[tuple[str, bool]], gpus: int) -> None:
        from simulators.cluster.controllers import usage as u

        self.u, self.pods, self.gpus, self.t0 = u, pods, gpus, time.time()
        self.gpu_rows = {name: tuple(u.GpuUsage(i, u.gpu_uuid(name, "main", i), "NVIDIA H100 80GB HBM3",
                                                0.0 if idle else 0.85, 40000.0, 41559.0, 70.0 if idle else 605.0)
                                     for i in range(gpus)) for name, idle in pods}
        self.dcgm: bytes | None = None  # the GPUs' text does not change: rendered once
        handler = self._handler()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def usages(self) -> list[Any]:
        u, now = self.u, time.time()
        out = []
        for name, _ in self.pods:
            container = u.ContainerUsage("main", "trainer:1", 8.0, 8.0 * (now - self.t0), 64 * 2**30, 256 * 2**30,
                                         self.gpu_rows[name])
            out.append(u.PodUsage("default", name, name, "sim-node-1", now, (container,)))
        return out

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        from simulators.cluster import podmetrics

        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                pass

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                if self.path.endswith("dcgm"):
                    exporter.dcgm = exporter.dcgm or podmetrics.dcgm_text(exporter.usages()).encode()
                    body = exporter.dcgm
                else:
                    body = podmetrics.cadvisor_text(exporter.usages()).encode()
                self.send_response(200)
                self.send_header("Content-Type", podmetrics.TEXT_CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


def populate(n: int) -> list[tuple[str, bool]]:
    """``n`` RUNNING executions (running for 1,000 s), in experiments of 100; their pods' names and idleness."""
    from core import pb
    from experiments import services as experiment_services
    from workunits import services as wu_services
    from workunits import state as guards
    from django.db.models import F

    from workunits.choices import WorkUnitState
    from workunits.models import WorkUnitExecution

    pods, keys = [], []
    for start in range(0, n, 100):
        exp = experiment_services.create_experiment(pb.experiment.Experiment(title="bench"), creator="bench@example.com")
        for wid in range(1, min(100, n - start) + 1):
            job = pb.work_unit.KubernetesJob(name="trainer", replicas=1, spec=pb.work_unit.ExecutableSpec(
                docker_image="gcr.io/proj/trainer:v1"))
            message = pb.work_unit.WorkUnit(executable=pb.work_unit.Executable(
                jobset=pb.work_unit.JobSetExecutable(jobs=[job])))
            wu_services.create_work_unit(exp.id, message, work_unit_id=wid)
            keys.append((exp.id, wid))
            pods.append((f"xmc-{exp.id}-{wid}-trainer-0-0-b{wid % 10}x7k", len(pods) % 10 == 0))
    running_since = time.time_ns()
    updates = [guards.ExecutionUpdate(xid=xid, wid=wid, eid=1, mask=(guards.STATE,), state=WorkUnitState.RUNNING,
                                      state_update_time_ns=running_since) for xid, wid in keys]
    for i in range(0, len(updates), 500):
        wu_services.update_work_unit_executions(updates[i:i + 500])
    # Running for 1,000 s already (longer than the idle window): the guards refuse a state time older
    # than the creation, so the bench moves it back itself.
    WorkUnitExecution.objects.update(state_update_time_ns=F("state_update_time_ns") - 1000 * 10**9)
    return pods


def wait_for(url: str, promql: str, want: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    from metrics import prometheus

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("prometheus exited")
        try:
            found = prometheus.query(url, promql)
            if found and found[0].value >= want:
                return
        except prometheus.PrometheusError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"Prometheus never had {promql} >= {want}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executions", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    exit_on_termination()
    import prometheus as prometheus_setup  # scripts/prometheus.py

    executable = prometheus_setup.binary()
    if executable is None:
        print("no prometheus on PATH (apt-get install prometheus): nothing to measure", file=sys.stderr)
        return 2
    with bench_database(), tempfile.TemporaryDirectory(prefix="xmc-bench-prom-") as folder:
        import psutil
        from django.conf import settings
        from django.db import connection

        from metrics import services, system
        from metrics.models import BLOCK_SIZES

        print(f"populating {args.executions} running executions ...", flush=True)
        pods = populate(args.executions)
        exporter = Exporter(pods, args.gpus)
        config = Path(folder) / "prometheus.yml"
        config.write_text(prometheus_setup.config_text(exporter.url, scrape_interval_s=5.0))
        port = _free_port()
        proc = subprocess.Popen(prometheus_setup.argv(executable, config, Path(folder) / "data", port),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            settings.XMC_PROMETHEUS_URL = url
            settings.XMC_SYSTEM_METRICS_INTERVAL_S = INTERVAL_S
            print("waiting for Prometheus to scrape every series twice ...", flush=True)
            wait_for(url, "count(DCGM_FI_DEV_GPU_UTIL)", args.executions * args.gpus, proc)
            wait_for(url, "count(rate(container_cpu_usage_seconds_total[60s]))", args.executions, proc)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                backend = psutil.Process(cursor.fetchone()[0])
            base = time.time()
            fetches = []
            for _ in range(args.cycles):
                started = time.perf_counter()
                results = system.fetch(base, INTERVAL_S)
                fetches.append(time.perf_counter() - started)
            series = sum(len(v) for v in results.values())
            # Before: one cycle writing every block size with the points (no pending rows), first, while its
            # instant is within Prometheus' lookback of the samples.
            eager, sizes = services._INSERT_MANY, services.EAGER_BLOCK_SIZES
            services._INSERT_MANY = eager.replace(services._PENDING_CTE, "")
            services.EAGER_BLOCK_SIZES = BLOCK_SIZES
            try:
                before = system.collect(datetime.fromtimestamp(base + INTERVAL_S, tz=UTC))
            finally:
                services._INSERT_MANY, services.EAGER_BLOCK_SIZES = eager, sizes
            assert before.measured == args.executions, (before, args.executions)
            cycles, cpu, pg_cpu, points, advisories = [], [], [], 0, 0
            done_cycles: list[Any] = []
            for k in range(1, args.cycles + 1):
                pg0, cpu0 = sum(backend.cpu_times()[:2]), time.process_time()
                done = system.collect(datetime.fromtimestamp(base + (k + 1) * INTERVAL_S, tz=UTC))
                cpu.append(time.process_time() - cpu0)
                pg_cpu.append(sum(backend.cpu_times()[:2]) - pg0)
                cycles.append(done.total_s)
                done_cycles.append(done)
                points += done.points
                advisories += done.advisories
                assert done.measured == args.executions, (done, args.executions)
            # The coarse blocks the cycles left pending, rolled up as the periodic pass does.
            pg0, started = sum(backend.cpu_times()[:2]), time.perf_counter()
            rolled = services.roll_up_blocks()
            roll_up, roll_up_pg = time.perf_counter() - started, sum(backend.cpu_times()[:2]) - pg0
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    fetch, cycle = statistics.median(fetches), statistics.median(cycles)
    print(f"\n{args.executions} running executions x {args.gpus} GPUs; {series} series per fetch; "
          f"{points} points and {advisories} advisories written over {args.cycles} cycles")
    print(f"baseline: raw PromQL fetch (5 queries at once)  median {fetch * 1000:.0f} ms")
    print(f"cycle: median {cycle * 1000:.0f} ms, max {max(cycles) * 1000:.0f} ms (target <= 2000 ms: "
          f"{'met' if max(cycles) <= 2.0 else 'NOT met'})")
    share = statistics.median(cpu) / INTERVAL_S
    print(f"cycle CPU: this process {statistics.median(cpu) * 1000:.0f} ms = {share:.1%} of one core at the "
          f"{INTERVAL_S:.0f} s interval (target <= 20%: {'met' if share <= 0.2 else 'NOT met'}); "
          f"Postgres {statistics.median(pg_cpu) * 1000:.0f} ms = {statistics.median(pg_cpu) / INTERVAL_S:.1%}")
    every = settings.XMC_METRICS_ROLL_UP_S / INTERVAL_S
    print(f"roll-up of {args.cycles} cycles' pending blocks ({rolled} block upserts): {roll_up * 1000:.0f} ms wall, "
          f"Postgres {roll_up_pg * 1000:.0f} ms; per cycle at one pass every {every:.0f} cycles "
          f"(XMC_METRICS_ROLL_UP_S, where more cycles share a block) at most {roll_up / args.cycles * 1000:.0f} ms "
          f"= {roll_up / args.cycles / INTERVAL_S:.1%} of one core")
    print(f"  of which writing (the cycle less its fetch): median "
          f"{statistics.median(c.total_s - c.fetch_s for c in done_cycles) * 1000:.0f} ms")
    print(f"before (every block size written with the points, {len(BLOCK_SIZES)} upserts a series): one cycle "
          f"{before.total_s * 1000:.0f} ms, of which writing {(before.total_s - before.fetch_s) * 1000:.0f} ms")
    print(f"ratio: the cycle is {cycle / fetch:.2f}x the raw fetch; {before.total_s / cycle:.1f}x faster than before "
          f"(writing: {(before.total_s - before.fetch_s) / statistics.median(c.total_s - c.fetch_s for c in done_cycles):.1f}x)")
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
