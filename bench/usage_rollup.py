"""Benchmark: ``GET /v1/usage`` over 30 days of 100,000 executions, against summing the state history.

    ./dev bench usage        (or: python bench/usage_rollup.py [--executions 100000] [--repeat 5])

On a throw-away database: ``--executions`` work units (100 per experiment, 50
owners, 4 queues, 1-8 GPUs or CPUs), one execution each, whose status history
says when they ran over the last 30 days; a tenth of them were preempted once
(two running intervals), 1 % still run. The history is inserted in SQL in two
statements, so the triggers of ``usage`` (migration 0001) build the running
intervals as every writer's would; the seed reports what a history insert costs
with the trigger against one its ``WHEN`` clause skips (the insert of the
INITIALIZING -> SCHEDULING rows, same size, same statement shape). Ended
intervals are settled with a stored utilisation; the running ones read
``system/gpu_utilization`` from their ``PointBlock`` rows.

Then each query is timed ``--repeat`` times (median) through the real view
(Django's test client, bearer token, JSON), by owner, experiment and queue,
as staff and as one researcher. The baseline, in the same run: the same
figures computed straight from the history (``LEAD`` over each execution's
rows, the allocation from the executable JSON, the utilisation from the points'
blocks), which is what the endpoint would cost without the stored intervals.
Target: every usage query <= 500 ms.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import importlib

from _django import bench_database
from _signals import exit_on_termination

TARGET_MS = 500.0
DAYS = 30
OWNERS = 50
QUEUES = ("cpu-queue", "gpu-queue", "demo-queue", "default")


def seed(executions: int) -> dict[str, float]:
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from metrics.models import BLOCK_SIZES
    from metrics.system_names import GPU_UTILIZATION

    now = timezone.now()
    start = now - timedelta(days=DAYS)
    experiments = max(1, executions // 100)
    with connection.cursor() as c:
        c.execute("""
            INSERT INTO experiments_experiment (id, title, creator, acls, priority, create_time, update_time, urls, tags,
                notes, resources, active_state, launch_state, launch_id, child_state_counts, message_severity_counts,
                status_update_time, last_wid)
            SELECT x, 'bench ' || x, 'owner' || (x %% %(owners)s) || '@example.com', '{}'::jsonb, 'NORMAL', %(start)s,
                   %(start)s, '[]'::jsonb, '{}', '', '[]'::jsonb, 'ACTIVE', 'COMPLETED', '', '{}'::jsonb, '{}'::jsonb,
                   %(start)s, 100
            FROM generate_series(1, %(experiments)s) AS x""", {"owners": OWNERS, "start": start,
                                                               "experiments": experiments})
        c.execute("SELECT setval(pg_get_serial_sequence('experiments_experiment', 'id'), %s)", [experiments])
        # One executable per (queue, kind, size): GPU units in gpu-queue, CPU units elsewhere.
        c.execute("""
            INSERT INTO workunits_workunit (experiment_id, wid, work_unit_type, priority, create_time, update_time, urls,
                executable, tags, notes, current_eid, args, arg_numbers)
            SELECT 1 + (n - 1) / 100, 1 + (n - 1) %% 100, 'STANDARD', 'NORMAL', %(start)s, %(start)s, '[]'::jsonb,
                   jsonb_build_object('schedulingConstraints', jsonb_build_object('queueName', (%(queues)s::text[])[1 + n %% 4]),
                       'jobset', jsonb_build_object('jobs', jsonb_build_array(jsonb_build_object('name', 'main',
                           'replicas', 1 + n %% 2, 'spec', jsonb_build_object('resources',
                               CASE WHEN n %% 4 = 1 THEN jsonb_build_object('gpuResources',
                                        jsonb_build_object('type', 'A100', 'count', (1 + n %% 8)::text))
                                    ELSE jsonb_build_object('cpuResources', jsonb_build_object(
                                        'cpuMillicores', (1000 * (1 + n %% 8))::text, 'memoryBytes', '1073741824'))
                               END))))),
                   '{}', '', 1, '{}'::jsonb, '{}'::jsonb
            FROM generate_series(1, %(n)s) AS n""", {"start": start, "queues": list(QUEUES), "n": executions})
        c.execute("""
            INSERT INTO workunits_workunitexecution (work_unit_id, eid, execution_state, create_time, update_time, state,
                state_update_time_ns, metadata)
            SELECT id, 1, 'ACTIVE', %(start)s, %(start)s, 'INITIALIZING', 0, '{}'::jsonb FROM workunits_workunit""",
                  {"start": start})
        # When each ran: a start spread over the 30 days, 5 min to 12 h long; a tenth preempted once in the middle.
        c.execute("""
            CREATE TEMP TABLE plan AS
            SELECT e.id AS execution_id,
                   %(start)s + (random() * interval '29 days') AS t0,
                   interval '5 minutes' + random() * interval '12 hours' AS run,
                   random() < 0.1 AS preempted, random() < 0.01 AS running
            FROM workunits_workunitexecution e""", {"start": start})
        timings: dict[str, float] = {}
        started = time.perf_counter()
        c.execute("""INSERT INTO workunits_statushistory (execution_id, time, from_state, to_state, writer, request_id, extra)
                     SELECT execution_id, t0 - interval '1 minute', 'INITIALIZING', 'SCHEDULING', 'reconciler', '', '{}'
                     FROM plan""")
        timings["history_skipped_s"] = time.perf_counter() - started
        started = time.perf_counter()
        c.execute("""INSERT INTO workunits_statushistory (execution_id, time, from_state, to_state, writer, request_id, extra)
                     SELECT execution_id, t0, 'SCHEDULING', 'RUNNING', 'reconciler', '', '{}' FROM plan""")
        timings["history_trigger_s"] = time.perf_counter() - started
        c.execute("""
            INSERT INTO workunits_statushistory (execution_id, time, from_state, to_state, writer, request_id, extra)
            SELECT execution_id, time, from_state, to_state, 'reconciler', '', '{}' FROM (
                SELECT execution_id, t0 + run / 3 AS time, 'RUNNING' AS from_state, 'DESCHEDULING' AS to_state, 1 AS k
                FROM plan WHERE preempted
                UNION ALL SELECT execution_id, t0 + run / 3 + interval '1 minute', 'DESCHEDULING', 'SCHEDULING', 2
                FROM plan WHERE preempted
                UNION ALL SELECT execution_id, t0 + run / 2, 'SCHEDULING', 'RUNNING', 3 FROM plan WHERE preempted
                UNION ALL SELECT execution_id, least(t0 + run, %(now)s), 'RUNNING', 'COMPLETED', 4
                FROM plan WHERE NOT running
            ) AS h ORDER BY execution_id, k""", {"now": now})
        c.execute("""UPDATE usage_running_interval SET settled = true, gpu_utilization = random()
                     WHERE end_time IS NOT NULL""")
        c.execute("""INSERT INTO metrics_pointblock (execution_id, metric, size, block, count, sum, min, max, last_step,
                         last_time)
                     SELECT DISTINCT execution_id, %(metric)s, %(size)s, 0, 100, 55.0, 0.1, 0.9, 99, %(now)s
                     FROM usage_running_interval WHERE end_time IS NULL AND gpus > 0""",
                  {"metric": GPU_UTILIZATION, "size": BLOCK_SIZES[-1], "now": now})
        c.execute("ANALYZE usage_running_interval")
        c.execute("ANALYZE workunits_statushistory")
        c.execute("ANALYZE metrics_pointblock")
        c.execute("SELECT count(*), count(*) FILTER (WHERE end_time IS NULL) FROM usage_running_interval")
        intervals, open_ = c.fetchone()
    timings["intervals"] = intervals
    timings["open"] = open_
    return timings


#: The same figures straight from the history: running intervals by LEAD over each execution's rows.
BASELINE = """
WITH h AS (
    SELECT h.execution_id, h.time, h.to_state,
           lead(h.time) OVER (PARTITION BY h.execution_id ORDER BY h.time, h.id) AS next_time
    FROM workunits_statushistory h
), spans AS (
    SELECT execution_id, time AS s, coalesce(next_time, %(now)s) AS e FROM h
    WHERE to_state IN ('RUNNING', 'PARTIALLY_FAILED') AND time < %(end)s AND coalesce(next_time, %(now)s) > %(start)s
), util AS (
    SELECT b.execution_id, sum(b.sum) / nullif(sum(b.count), 0) AS u FROM metrics_pointblock b
    WHERE b.metric = %(metric)s AND b.size = %(size)s GROUP BY b.execution_id
)
SELECT {key}, sum(a.gpus * hrs), sum(a.gpus * hrs * coalesce(u.u, 0)), sum(a.cpu_millicores / 1000.0 * hrs),
       count(DISTINCT s.execution_id)
FROM (SELECT execution_id, greatest(0, extract(epoch FROM least(e, %(end)s) - greatest(s, %(start)s)) / 3600.0) AS hrs
      FROM spans) s
JOIN workunits_workunitexecution x ON x.id = s.execution_id
JOIN workunits_workunit w ON w.id = x.work_unit_id
JOIN experiments_experiment ex ON ex.id = w.experiment_id
CROSS JOIN LATERAL {allocation} a
LEFT JOIN util u ON u.execution_id = s.execution_id
WHERE {mine}
GROUP BY 1 ORDER BY 2 DESC LIMIT 100
"""
ALLOCATION = ""  # the migration's (usage.migrations.0001_initial.ALLOCATION), set in main
BASELINE_KEYS = {"owner": "ex.creator", "experiment": "ex.id::text",
                 "queue": "coalesce(w.executable -> 'schedulingConstraints' ->> 'queueName', '')"}


def median_ms(fn: Any, repeat: int) -> float:
    if repeat > 1:
        fn()  # warm
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    exit_on_termination()
    with bench_database():
        from datetime import timedelta

        from django.contrib.auth.models import User
        from django.db import connection
        from django.test import Client
        from django.utils import timezone

        from metrics.models import BLOCK_SIZES
        from metrics.system_names import GPU_UTILIZATION
        from xmc.auth.tokens import issue_token

        global ALLOCATION
        ALLOCATION = importlib.import_module("usage.migrations.0001_initial").ALLOCATION

        print(f"seeding {args.executions:,} executions over {DAYS} days ...", flush=True)
        started = time.perf_counter()
        seeded = seed(args.executions)
        print(f"  seeded in {time.perf_counter() - started:.1f} s: {seeded['intervals']:,} running intervals "
              f"({seeded['open']:,} open)")
        per_row = 1e6 / args.executions
        print(f"  history insert: {seeded['history_trigger_s'] * per_row:.1f} us/row with the usage trigger, "
              f"{seeded['history_skipped_s'] * per_row:.1f} us/row skipped by its WHEN "
              f"(ratio {seeded['history_trigger_s'] / seeded['history_skipped_s']:.2f})")
        User.objects.create_user("staff", "staff@example.com", "x", is_staff=True)
        staff = Client(HTTP_AUTHORIZATION=f"Bearer {issue_token('staff@example.com')}")
        owner = Client(HTTP_AUTHORIZATION=f"Bearer {issue_token('owner7@example.com')}")
        now = timezone.now()
        period = {"startTime": (now - timedelta(days=DAYS)).isoformat(), "endTime": now.isoformat()}
        params = {"now": now, "start": now - timedelta(days=DAYS), "end": now, "metric": GPU_UTILIZATION,
                  "size": BLOCK_SIZES[-1]}
        print(f"\n{'query':<34} {'usage ms':>9} {'baseline ms':>12} {'ratio':>7}  target <= {TARGET_MS:.0f} ms")
        worst = 0.0
        for who, client, mine in (("staff", staff, "TRUE"), ("owner7", owner, "ex.creator = 'owner7@example.com'")):
            for group_by in ("owner", "experiment", "queue"):
                def call(c: Any = client, g: str = group_by) -> None:
                    response = c.get("/v1/usage", {"groupBy": g, **period})
                    assert response.status_code == 200, response.content

                def baseline(g: str = group_by, m: str = mine) -> None:
                    with connection.cursor() as cursor:
                        cursor.execute(BASELINE.replace("{key}", BASELINE_KEYS[g]).replace("{mine}", m)
                                       .replace("{allocation}", ALLOCATION), params)
                        cursor.fetchall()

                ms, base = median_ms(call, args.repeat), median_ms(baseline, 1)
                worst = max(worst, ms)
                print(f"{who + ' by ' + group_by:<34} {ms:>9.1f} {base:>12.1f} {base / ms:>6.1f}x")
        print(f"\nslowest usage query {worst:.1f} ms: {'OK' if worst <= TARGET_MS else 'OVER'} the {TARGET_MS:.0f} ms target")
        return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
