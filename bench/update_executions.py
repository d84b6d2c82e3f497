"""Benchmark: guarded execution updates per second, against a raw-SQL floor.

    ./dev bench update_executions        (or: python bench/update_executions.py)

Work units in experiments (default 1,000 in 10) receive streams of masked
updates (state + detailed status; every update changes its execution), in
batches (default 500), all in one run on one database:

* ``new``: ``workunits.services.update_work_unit_executions`` (set-based);
* ``old``: the row-by-row ORM path it replaced
  (``tests/workunits/oracle_update.py``);
* ``single``: the new path with one transaction per update;
* ``floor``: the same UPDATE and history INSERT as raw SQL without lock,
  read or guards (what the database alone costs).

Each on 1 and 2 writer connections, as the reconciler's batcher writes
(``k8s_bridge.reconciler.batcher``): each batch is split into shards of
experiments (``xid % connections``) and every connection writes its own
shard's parts one after another, never waiting for the other connection.
``--barrier`` instead waits for every part of a batch before the next batch
starts (``workunits.writers.ParallelWriter.map``, how the batcher flushed
before it was sharded). Prints updates/s, ratios to the old path and to the
floor, SQL statements per batch, and the share of execution updates Postgres
did as HOT updates.
Target: new path >= 15,000 guarded updates/s with 2 connections (>= 5x old).
``--setup-sql`` runs statements after migrating (to measure schema variants,
e.g. ``--setup-sql "ALTER TABLE workunits_workunitexecution SET (fillfactor = 100)"``).
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from _django import bench_database
from _signals import exit_on_termination

CYCLE = ["SCHEDULING", "STARTING", "RUNNING", "PARTIALLY_FAILED"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--single-updates", type=int, default=1_000, help="updates for the one-transaction runs")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--work-units", type=int, default=1_000)
    parser.add_argument("--experiments", type=int, default=10)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--variants", nargs="+", default=["floor", "new", "old", "single"])
    parser.add_argument("--setup-sql", action="append", default=[])
    parser.add_argument("--barrier", action="store_true",
                        help="all parts of a batch finish before the next batch starts")
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)

    with bench_database():
        from django.db import connection, transaction
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from tests.workunits import oracle_update
        from workunits import services, state
        from workunits.models import WorkUnitExecution
        from workunits.state import ExecutionUpdate
        from workunits.writers import ParallelWriter, split_by_experiment
        from core import convert, pb

        with connection.cursor() as cursor:
            for sql in args.setup_sql:
                cursor.execute(sql)

        print(f"setting up {args.work_units} work units in {args.experiments} experiments ...", flush=True)
        from experiments import services as experiment_services
        from tests import factories

        keys: list[tuple[int, int]] = []
        per_exp = (args.work_units + args.experiments - 1) // args.experiments
        for e in range(args.experiments):
            exp = experiment_services.create_experiment(pb.experiment.Experiment(), creator=factories.ALICE)
            for _ in range(min(per_exp, args.work_units - e * per_exp)):
                keys.append((exp.id, services.create_work_unit(exp.id, factories.work_unit_message()).work_unit.wid))
        execution_id = {
            (xid, wid): ex_id for ex_id, xid, wid in WorkUnitExecution.objects.values_list(
                "id", "work_unit__experiment_id", "work_unit__wid")
        }
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        clock = [convert.ns_from_datetime(timezone.now()) + 10**12]
        passes = [0]

        def make_updates(n: int) -> list[ExecutionUpdate]:
            """n updates over every key in turn; each pass moves every execution to its next state."""
            updates = []
            for i in range(n):
                k = i % len(keys)
                if k == 0:
                    passes[0] += 1
                clock[0] += 1_000
                xid, wid = keys[k]
                updates.append(ExecutionUpdate(
                    xid=xid, wid=wid, eid=1, mask=(state.STATE, state.DETAILED_STATUS),
                    state=CYCLE[(passes[0] + k) % len(CYCLE)], state_update_time_ns=clock[0],
                    detailed_status={"jobsetStatus": {"restarts": str(passes[0] % 3)}},
                ))
            return updates

        def floor_write(batch: Sequence[ExecutionUpdate]) -> None:
            """The same UPDATE and INSERT (one statement), values as given: no lock, no read, no guards."""
            now = timezone.now()
            rows = [{
                "id": execution_id[u.key], "state": u.state, "state_update_time_ns": u.state_update_time_ns,
                "detailed_status": dict(u.detailed_status or {}), "mlrun_url": "",
            } for u in batch]
            history = [{
                "n": n, "execution_id": execution_id[u.key], "from_state": "", "to_state": u.state,
                "writer": u.writer, "operation_id": None, "request_id": "", "extra": {"mask": list(u.mask)},
            } for n, u in enumerate(batch)]
            with transaction.atomic(durable=True), connection.cursor() as cursor:
                cursor.execute(services.executions._WRITE_SQL, {
                    "now": now, "executions": services.executions._dumps(rows), "history": services.executions._dumps(history)})

        def single_write(batch: Sequence[ExecutionUpdate]) -> None:
            for update in batch:
                services.update_work_unit_executions([update])

        writers: dict[str, Callable[[Sequence[ExecutionUpdate]], object]] = {
            "floor": floor_write,
            "new": services.update_work_unit_executions,
            "old": oracle_update.update_work_unit_executions,
            "single": single_write,
        }

        def hot_counts() -> tuple[int, int]:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s",
                    [WorkUnitExecution._meta.db_table],
                )
                upd, hot = cursor.fetchone()
            return int(upd), int(hot)

        def run(variant: str, n_conn: int) -> tuple[float, float]:
            n = args.single_updates if variant == "single" else args.updates
            updates = make_updates(n)
            batches = [updates[i:i + args.batch] for i in range(0, n, args.batch)]
            write = writers[variant]
            before = hot_counts()
            with ParallelWriter(n_conn) as writer:
                t0 = time.perf_counter()
                if args.barrier:
                    for batch in batches:
                        for outcome in writer.map(write, split_by_experiment(batch, n_conn)):
                            if isinstance(outcome, Exception):
                                raise outcome
                else:
                    streams: list[list[list[ExecutionUpdate]]] = [[] for _ in range(n_conn)]
                    for batch in batches:
                        for shard, stream in enumerate(streams):
                            part = [u for u in batch if u.xid % n_conn == shard]
                            if part:
                                stream.append(part)
                    futures = [writer.submit(shard, lambda stream=stream: [write(part) for part in stream])
                               for shard, stream in enumerate(streams)]
                    for future in futures:
                        future.result()
                elapsed = time.perf_counter() - t0
            time.sleep(0.6)  # statistics are flushed to the shared view about every half second
            after = hot_counts()
            upd, hot = after[0] - before[0], after[1] - before[1]
            return n / elapsed, (hot / upd if upd else 0.0)

        # Statements per batch (one connection, a batch of --batch updates).
        statements = {}
        for variant in ("new", "old"):
            batch = make_updates(args.batch)
            with CaptureQueriesContext(connection) as ctx:
                writers[variant](batch)
            # An executemany is logged once as "N times: ..."; count its N statements.
            statements[variant] = sum(
                int(q["sql"].split(" times: ", 1)[0]) if " times: " in q["sql"] else 1 for q in ctx.captured_queries
            )

        results: dict[tuple[str, int], tuple[float, float]] = {}
        for n_conn in args.connections:
            for variant in args.variants:
                print(f"running {variant} on {n_conn} connection(s) ...", flush=True)
                results[(variant, n_conn)] = run(variant, n_conn)

        print()
        print(f"{args.updates} updates (one-transaction runs: {args.single_updates}) over {len(keys)} work units "
              f"in {args.experiments} experiments, batches of {args.batch}, "
              + ("a barrier after every batch" if args.barrier else "each connection its own shard of experiments"))
        print(f"SQL statements per batch of {args.batch} ({args.experiments} experiments, savepoints and BEGIN/COMMIT "
              f"included): new {statements['new']}, old {statements['old']}")
        print(f"{'variant':<8} {'conns':>5} {'updates/s':>10} {'x old':>7} {'/ floor':>8} {'HOT':>5}")
        for (variant, n_conn), (rate, hot) in results.items():
            old = results.get(("old", n_conn))
            floor = results.get(("floor", n_conn))
            print(f"{variant:<8} {n_conn:>5} {rate:>10.0f} "
                  f"{(rate / old[0]) if old else float('nan'):>6.1f}x "
                  f"{(rate / floor[0]) if floor else float('nan'):>7.2f} {hot:>5.0%}")
        best = results.get(("new", 2))
        if best:
            print(f"target: new path >= 15,000 updates/s on 2 connections: {best[0]:.0f} "
                  f"({'met' if best[0] >= 15_000 else 'NOT met'})")


if __name__ == "__main__":
    main()
