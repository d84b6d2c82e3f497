"""Benchmark: batched guarded updates versus one transaction per update.

    ./dev bench update_executions        (or: python bench/update_executions.py)

Applies the same 10,000 guarded execution updates twice on the same database
in the same run: once in batches of 500 through one
``update_work_unit_executions`` call per batch (what the reconciler's
batcher does), once with one call (one transaction) per update. Prints both
throughputs and the ratio. Target: batched at least 10x faster.
"""
from __future__ import annotations

import argparse
import itertools
import time

from _django import bench_database

CYCLE = ["SCHEDULING", "STARTING", "RUNNING", "PARTIALLY_FAILED"]


def make_updates(keys, n: int, start_ns: int):
    from workunits import state
    from workunits.state import ExecutionUpdate

    updates = []
    states = itertools.cycle(CYCLE)
    for i in range(n):
        xid, wid = keys[i % len(keys)]
        updates.append(ExecutionUpdate(
            xid=xid, wid=wid, eid=1, mask=(state.STATE, state.DETAILED_STATUS), state=next(states),
            state_update_time_ns=start_ns + i * 1000,
            detailed_status={"jobsetStatus": {"restarts": str(i % 3)}},
        ))
    return updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--work-units", type=int, default=1_000)
    args = parser.parse_args()

    with bench_database():
        from django.utils import timezone

        from tests import factories
        from workunits import services
        from workunits.models import StatusHistory
        from xmc import convert

        print(f"setting up {args.work_units} work units ...", flush=True)
        keys = []
        for e in range((args.work_units + 99) // 100):
            exp = factories.experiment()
            for _ in range(min(100, args.work_units - e * 100)):
                keys.append((exp.id, factories.work_unit(exp).wid))

        def run_batched(start_ns: int) -> float:
            updates = make_updates(keys, args.updates, start_ns)
            t0 = time.perf_counter()
            for i in range(0, len(updates), args.batch):
                services.update_work_unit_executions(updates[i:i + args.batch])
            return time.perf_counter() - t0

        def run_single(start_ns: int) -> float:
            updates = make_updates(keys, args.updates, start_ns)
            t0 = time.perf_counter()
            for update in updates:
                services.update_work_unit_executions([update])
            return time.perf_counter() - t0

        base = convert.ns_from_datetime(timezone.now()) + 10**12
        history_before = StatusHistory.objects.count()
        single = run_single(base)
        history_single = StatusHistory.objects.count() - history_before
        batched = run_batched(base + 10**12)
        history_batched = StatusHistory.objects.count() - history_before - history_single

        print(f"updates:                 {args.updates} over {len(keys)} work units")
        print(f"one transaction each:    {args.updates / single:10.0f} updates/s ({single:.2f} s)")
        print(f"batches of {args.batch:<5}         {args.updates / batched:10.0f} updates/s ({batched:.2f} s)")
        print(f"ratio batched/single:    {single / batched:10.1f}x  (target >= 10x)")
        print(f"accepted changes:        single {history_single}, batched {history_batched} "
              "(the batched run starts where the first ended, so some first updates are same-state no-ops)")


if __name__ == "__main__":
    main()
