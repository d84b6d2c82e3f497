"""Benchmark: metric ingest through the HTTP write path against a raw COPY floor, and GetChartData at volume.

    ./dev bench metrics      (or: python bench/metrics.py [--batches 400] [--batch 1000] [--clients 4]
                                                          [--chart-points 10000000] [--work-units 100])

On a throw-away database, with the web app under gunicorn (2 workers x 4
threads), everything measured in the same run:

1. **Ingest over HTTP**: ``--clients`` threads, each with its own keep-alive
   connection (``http.client``: the load generator shares the machine, so it
   is kept light; bodies are built before the clock starts), POST
   ``--batches`` batches of ``--batch`` new points to
   ``/v1/experiments/{xid}/workUnits/{wid}/metrics:write`` with the work
   unit's metrics token (the path a job's writer takes). Points/s, p50/p99 per
   batch.
2. **The raw COPY floor**: the same batches ``COPY``-ed straight into the
   points table from as many connections, one transaction each (no HTTP, no
   JSON, no validation, no duplicate check, no blocks): what Postgres itself
   takes on this machine. Ratios against it.
3. **GetChartData**: ``--chart-points`` points over ``--work-units`` work
   units written by `write_points` in 10,000-point batches (blocks included),
   then charts at 1,000 px evaluated in-process (`metrics.data.chart_data`,
   the handler's work without the transport): p50/p99 over ``--chart-calls``
   calls, and the points answered (bounded by the width, not by the points
   stored). Baseline in the same run: one plain indexed scan over the same
   points (``count(*), avg(value)`` through the (execution, metric, step)
   b-tree), what any design that reads every point pays at least. The query
   plans are checked (EXPLAIN ANALYZE) to use the indexes.
"""
from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from _django import ROOT, bench_database  # noqa: E402
from _signals import exit_on_termination

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


def wait_http(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"web exited early with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"port {port} did not answer")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def in_threads(jobs: list[Callable[[], None]]) -> float:
    """Run ``jobs`` each in its own thread (and database connection); the wall time."""
    from django.db import connection

    errors: list[BaseException] = []

    def run(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


def copy_rows(rows: list[tuple[int, str, int, float, datetime]]) -> None:
    """One raw COPY of ``rows`` straight into the points table, one transaction."""
    from django.db import connection, transaction

    from metrics.models import MetricPoint

    with transaction.atomic(), connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {MetricPoint._meta.db_table} (execution_id, metric, step, value, time) "
                                "FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "text", "int8", "float8", "timestamptz"])
            for row in rows:
                copy.write_row(row)


def summaries_ratio(services: Any, free: list[int], batch: int, rounds: int = 6, batches: int = 40) -> float:
    """Points/s of `write_points` with the summaries' upsert over points/s without it (same batches)."""
    plain = services._INSERT_POINTS_AND_BLOCKS.removesuffix(", ") + " SELECT count(*) FROM new"
    today = services._INSERT
    stamp = datetime.now(timezone.utc)
    per_metric = max(1, batch // 10)
    rates: dict[str, list[float]] = {"without": [], "with": []}
    executions = iter(free)
    try:
        for r in range(rounds):
            for label in (("without", "with") if r % 2 else ("with", "without")):
                services._INSERT = plain if label == "without" else today
                execution = next(executions)
                started = time.perf_counter()
                for b in range(batches):
                    services.write_points(execution, [
                        services.Point(f"m{m}", b * per_metric + s, 1.0 / (s + 1), stamp)
                        for m in range(10) for s in range(per_metric)])
                rates[label].append(batches * 10 * per_metric / (time.perf_counter() - started))
    finally:
        services._INSERT = today
    with_rate, without_rate = pct(rates["with"], .5), pct(rates["without"], .5)
    ratio = with_rate / without_rate
    print(f"  summaries at ingest: write_points {with_rate:8.0f} points/s with them, {without_rate:8.0f} without "
          f"(median of {rounds} rounds of {batches} batches, 10 metrics x {per_metric} steps): "
          f"{ratio:.2f}x (target >= 0.8x)")
    return ratio


def plan_nodes(sql: str, params: list[Any]) -> list[str]:
    """The scan nodes of ``sql``'s EXPLAIN ANALYZE ("Index Only Scan using x" ...)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, TIMING OFF) " + sql, params)
        lines = [row[0].strip().lstrip("-> ") for row in cursor.fetchall()]
    return sorted({line.split("  (")[0].split(" on ")[0] for line in lines if "Scan" in line})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--chart-points", type=int, default=10_000_000)
    parser.add_argument("--work-units", type=int, default=100)
    parser.add_argument("--chart-calls", type=int, default=30)
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)
    # Fresh executions for each ingest run, and 12 for the summaries' rounds.
    args.work_units = max(args.work_units, 2 * args.clients + 12)

    with bench_database():
        from django.db import connection

        from core import pb
        from metrics import data as chart_data
        from metrics import services, tokens
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
            wait_http(port, web)
            exp = factories.experiment()
            for w in range(1, args.work_units + 1):
                factories.work_unit(exp, wid=w)
            executions = {e.work_unit.wid: e.pk for e in
                          WorkUnitExecution.objects.filter(work_unit__experiment=exp).select_related("work_unit")}
            now = datetime.now(timezone.utc)
            stamp = now.isoformat().replace("+00:00", "Z")
            per_client = args.batches // args.clients
            total = per_client * args.clients * args.batch

            # 1. Ingest over HTTP: each client writes its own work unit (wid 1..clients), steps never repeat.
            def bodies(index: int) -> list[bytes]:
                return [json.dumps({"points": [{"metric": "loss", "step": b * args.batch + i,
                                                "value": 1.0 / (i + 1), "time": stamp}
                                               for i in range(args.batch)]}).encode()
                        for b in range(per_client)]

            prepared = [bodies(i) for i in range(args.clients)]
            latencies: list[float] = []
            failures: list[str] = []
            lock = threading.Lock()

            def client(index: int) -> Callable[[], None]:
                def run() -> None:
                    wid = index + 1
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                    headers = {"Authorization": f"Bearer {tokens.token_for(exp.id, wid, 1)}",
                               "Content-Type": "application/json"}
                    target = f"/v1/experiments/{exp.id}/workUnits/{wid}/metrics:write"
                    for body in prepared[index]:
                        started = time.perf_counter()
                        conn.request("POST", target, body=body, headers=headers)
                        response = conn.getresponse()
                        text = response.read()
                        took = time.perf_counter() - started
                        with lock:
                            latencies.append(took)
                            if response.status != 200:
                                failures.append(text[:200].decode(errors="replace"))
                return run

            http_s = in_threads([client(i) for i in range(args.clients)])
            if failures:
                raise SystemExit(f"{len(failures)} batches failed: {failures[0]}")
            assert MetricPoint.objects.count() == total
            http_rate = total / http_s

            # 2. The raw COPY floor: the same batches straight into the table (work units clients+1 ..).
            def floor(index: int) -> Callable[[], None]:
                execution = executions[args.clients + index + 1]

                def run() -> None:
                    for b in range(per_client):
                        copy_rows([(execution, "loss", b * args.batch + i, 1.0 / (i + 1), now)
                                   for i in range(args.batch)])
                return run

            copy_rate = total / in_threads([floor(i) for i in range(args.clients)])
            print(f"ingest: {total} points per run in batches of {args.batch}, {args.clients} clients "
                  f"(gunicorn 2 workers x 4 threads)")
            print(f"  HTTP write path      {http_rate:10.0f} points/s   batch p50 {pct(latencies, .5) * 1000:.1f} ms"
                  f"  p99 {pct(latencies, .99) * 1000:.1f} ms   {http_rate / copy_rate:.2f}x the floor")
            print(f"  raw COPY floor       {copy_rate:10.0f} points/s   (same batches, one transaction each)")

            # 2b. What the metric summaries cost at ingest: write_points in-process, the statement of before
            # (points and blocks only) against today's (with the summaries' upsert), alternating rounds on
            # fresh executions, 10 metrics x 100 steps a batch (a job logging ten metrics).
            summaries_ratio(services, list(executions.values())[2 * args.clients:], args.batch)

            # 3. GetChartData over many points of many work units, written the way jobs write them.
            with connection.cursor() as cursor:
                cursor.execute("TRUNCATE metrics_metricpoint, metrics_pointspan, metrics_pointblock")
            per_unit = args.chart_points // args.work_units
            t0 = now - timedelta(seconds=per_unit * 0.05)
            started = time.perf_counter()
            for wid, pk in sorted(executions.items()):
                for start in range(0, per_unit, 10_000):
                    services.write_points(pk, [services.Point("loss", s, 1.0 / (s + 1) + wid * 1e-3,
                                                              t0 + timedelta(seconds=s * 0.05))
                                               for s in range(start, min(per_unit, start + 10_000))])
            load_s = time.perf_counter() - started
            connection.close()
            with connection.cursor() as cursor:  # what autovacuum does soon after: analyze, all-visible pages
                cursor.execute("VACUUM ANALYZE metrics_pointblock")
                cursor.execute("ANALYZE metrics_metricpoint")
            stored = args.work_units * per_unit
            print(f"GetChartData: {stored} points, {args.work_units} work units x {per_unit} steps, 1,000 px "
                  f"(written by write_points in {load_s:.0f} s, {stored / load_s:.0f} points/s)")

            ids = sorted(executions.values())
            scan_sql = (f"SELECT count(*), avg(value) FROM {MetricPoint._meta.db_table} "
                        "WHERE execution_id = ANY(%s) AND metric = 'loss'")
            scan_times = []
            for _ in range(3):
                started = time.perf_counter()
                with connection.cursor() as cursor:
                    cursor.execute(scan_sql, [ids])
                    assert cursor.fetchone()[0] == stored
                scan_times.append(time.perf_counter() - started)
            scan_s = min(scan_times)
            print(f"  baseline: one indexed scan of every point   {scan_s * 1000:6.0f} ms   "
                  f"plan {plan_nodes(scan_sql, [ids])[:2]}")

            M = pb.dashboard
            plot = M.PlotSpec(plot_id="loss", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]))
            mean = M.PlotSpec(plot_id="mean", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                              stats=M.StatSpec(aggregation=M.StatSpec.MEAN))
            for label, plots, scope in (
                (f"{args.work_units} work units, a series each", [plot], chart_data.Scope(exp.id, None)),
                (f"{args.work_units} work units, MEAN", [mean], chart_data.Scope(exp.id, None)),
                ("one work unit", [plot], chart_data.Scope(exp.id, 1)),
            ):
                times: list[float] = []
                answer = None
                for _ in range(args.chart_calls):
                    started = time.perf_counter()
                    answer = chart_data.chart_data("bench", scope, plots, 1000)
                    times.append(time.perf_counter() - started)
                assert answer is not None
                answered = sum(len(p.scatter_series.points) for p in answer.plots_data)
                print(f"  {label:<38} p50 {pct(times, .5) * 1000:5.0f} ms  p95 {pct(times, .95) * 1000:5.0f} ms"
                      f"  p99 {pct(times, .99) * 1000:5.0f} ms"
                      f"  ({pct(times, .99) / scan_s:.2f}x the scan)  {answered} points answered, "
                      f"{answer.ByteSize()} bytes")

            # The plans: the chart's reads walk the indexes.
            size = chart_data.block_size(per_unit, 1000)
            blocks_sql = chart_data._BLOCKS_SQL.format(scope_from=chart_data._SCOPE_FROM,
                                                       scope_where="w.experiment_id = %s", blocks="metrics_pointblock")
            print(f"  plan, blocks of {size} steps: {plan_nodes(blocks_sql, [['loss'], [size], exp.id])}")
            window = chart_data._window(chart_data.Scope(exp.id, None))
            assert window is not None
            bounds_sql = chart_data._STEP_BOUNDS_SQL.format(
                scope_from=chart_data._SCOPE_FROM, scope_where="w.experiment_id = %s",
                points=MetricPoint._meta.db_table, ranges="p.time BETWEEN %s AND %s")
            print(f"  plan, series' first and last steps: "
                  f"{plan_nodes(bounds_sql, [['loss'], *window, *window, exp.id])}")
        finally:
            web.terminate()
            web.wait(timeout=30)


if __name__ == "__main__":
    main()
