"""Benchmark: metric ingest through the HTTP write path against a raw COPY floor, and GetChartData.

    ./dev bench metrics      (or: python bench/metrics.py [--batches 300] [--batch 1000] [--clients 4]
                                                          [--chart-points 10000000] [--work-units 100])

On a throw-away database, with the web app under gunicorn (2 workers x 4
threads, as ./dev run):

1. **Ingest**: ``--clients`` threads, each with its own keep-alive connection,
   POST ``--batches`` batches of ``--batch`` new points to
   ``/v1/experiments/{xid}/workUnits/{wid}/metrics:write`` with the work
   unit's metrics token (the path a job's writer takes). Points/s, and p50/p99
   per batch.
2. **The floor**, in the same run: the same number of points written straight
   into the table with ``COPY`` from one connection (no HTTP, no JSON, no
   validation): what Postgres itself takes on this machine. The ratio is the
   write path's cost.
3. **GetChartData**: ``--chart-points`` points spread over ``--work-units``
   work units (loaded with COPY), then a chart over all of them
   (``parent_experiment``) at 1,000 px, evaluated in-process
   (`metrics.data.chart_data`, the handler's work without the transport):
   p50/p99 over repeated calls, and the rows it answers (bounded by the width,
   not by the points stored).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from datetime import datetime, timedelta, timezone

from _django import ROOT, bench_database  # noqa: E402

# This file is bench/metrics.py, and its folder is on the path: load the app package under the
# name `metrics` first, or Django's `import metrics` would find this script.
_spec = importlib.util.spec_from_file_location("metrics", ROOT / "metrics" / "__init__.py",
                                               submodule_search_locations=[str(ROOT / "metrics")])
assert _spec is not None and _spec.loader is not None
sys.modules["metrics"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["metrics"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"web exited early with {proc.returncode}")
        try:
            requests.get(url, timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def copy_points(connection: object, rows: list[tuple[int, str, int, float, datetime]]) -> None:
    from metrics.models import MetricPoint

    with connection.cursor() as cursor:  # type: ignore[attr-defined]
        raw = cursor.cursor  # the psycopg cursor
        with raw.copy(f"COPY {MetricPoint._meta.db_table} (execution_id, metric, step, value, time) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--chart-points", type=int, default=10_000_000)
    parser.add_argument("--work-units", type=int, default=100)
    parser.add_argument("--chart-calls", type=int, default=30)
    args = parser.parse_args()
    args.work_units = max(args.work_units, args.clients + 1)  # one per client, one for the COPY floor

    with bench_database():
        import requests
        from django.db import connection, transaction

        from core import pb
        from metrics import data as chart_data
        from metrics import tokens
        from metrics.models import MetricPoint
        from tests import factories
        from workunits.models import WorkUnitExecution

        db = connection.settings_dict
        url = urllib.parse.urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/xmc"))
        env = {**os.environ, "DATABASE_URL": urllib.parse.urlunsplit(url._replace(path="/" + db["NAME"])),
               "XMC_LOG_LEVEL": "WARNING"}
        port = free_port()
        web = subprocess.Popen([sys.executable, "-m", "gunicorn", "xmc.wsgi", "-b", f"127.0.0.1:{port}", "-w", "2",
                                "--threads", "4", "--log-level", "warning"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL)
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", web)
            exp = factories.experiment()
            units = [factories.work_unit(exp, wid=w) for w in range(1, args.work_units + 1)]
            executions = {e.work_unit.wid: e.pk for e in
                          WorkUnitExecution.objects.filter(work_unit__experiment=exp).select_related("work_unit")}
            now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")

            # 1. Ingest over HTTP: each client writes its own work unit, steps never repeat.
            per_client = args.batches // args.clients
            latencies: list[float] = []
            failures: list[str] = []
            lock = threading.Lock()

            def client(index: int) -> None:
                wid = index + 1
                session = requests.Session()
                target = f"http://127.0.0.1:{port}/v1/experiments/{exp.id}/workUnits/{wid}/metrics:write"
                headers = {"Authorization": f"Bearer {tokens.token_for(exp.id, wid, 1)}",
                           "Content-Type": "application/json"}
                bodies = [json.dumps({"points": [{"metric": "loss", "step": b * args.batch + i, "value": 1.0 / (i + 1),
                                                  "time": now} for i in range(args.batch)]}).encode()
                          for b in range(per_client)]
                for body in bodies:
                    started = time.perf_counter()
                    response = session.post(target, data=body, headers=headers, timeout=60)
                    took = time.perf_counter() - started
                    with lock:
                        latencies.append(took)
                        if response.status_code != 200:
                            failures.append(response.text[:200])

            # Warm-up: one batch per client.
            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
            if failures:
                raise SystemExit(f"{len(failures)} batches failed: {failures[0]}")
            http_points = per_client * args.clients * args.batch
            assert MetricPoint.objects.count() == http_points
            http_rate = http_points / elapsed

            # 2. The COPY floor: the same number of points, one connection, straight into the table.
            rows = [(executions[args.clients + 1], "loss", i, 1.0 / (i + 1), datetime.now(timezone.utc))
                    for i in range(http_points)]
            started = time.perf_counter()
            with transaction.atomic():
                copy_points(connection, rows)
            copy_rate = http_points / (time.perf_counter() - started)
            print(f"ingest: {http_points} points in batches of {args.batch}, {args.clients} clients")
            print(f"  HTTP write path   {http_rate:10.0f} points/s   batch p50 {pct(latencies, .5) * 1000:.1f} ms"
                  f"  p99 {pct(latencies, .99) * 1000:.1f} ms")
            print(f"  raw COPY floor    {copy_rate:10.0f} points/s")
            print(f"  ratio             {http_rate / copy_rate:10.2f} of the floor")

            # 3. GetChartData over many points of many work units.
            MetricPoint.objects.all().delete()
            per_unit = args.chart_points // args.work_units
            t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
            started = time.perf_counter()
            for wid, pk in sorted(executions.items()):
                with transaction.atomic():
                    copy_points(connection, [(pk, "loss", s, 1.0 / (s + 1) + wid * 1e-3, t0 + timedelta(seconds=s))
                                             for s in range(per_unit)])
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {MetricPoint._meta.db_table}")
            load_s = time.perf_counter() - started
            M = pb.dashboard
            plot = M.PlotSpec(plot_id="loss", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]))
            mean = M.PlotSpec(plot_id="mean", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                              stats=M.StatSpec(aggregation=M.StatSpec.MEAN))
            for label, plots, scope in (
                ("one work unit", [plot], chart_data.Scope(exp.id, 1)),
                (f"{args.work_units} work units", [plot], chart_data.Scope(exp.id, None)),
                (f"{args.work_units} work units, MEAN", [mean], chart_data.Scope(exp.id, None)),
            ):
                times: list[float] = []
                answer = None
                for _ in range(args.chart_calls):
                    started = time.perf_counter()
                    answer = chart_data.chart_data("bench", scope, plots, 1000)
                    times.append(time.perf_counter() - started)
                assert answer is not None
                rows_out = sum(len(p.scatter_series.points) for p in answer.plots_data)
                print(f"GetChartData, {label}, 1000 px: p50 {pct(times, .5) * 1000:.0f} ms, "
                      f"p99 {pct(times, .99) * 1000:.0f} ms, {rows_out} points answered "
                      f"({args.chart_points if scope.wid is None else per_unit} stored; loaded in {load_s:.0f} s)")
        finally:
            web.terminate()
            web.wait(timeout=30)


if __name__ == "__main__":
    main()
