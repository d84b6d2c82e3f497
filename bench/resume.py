"""Benchmark: resume 10,000 paused tasks.

    ./dev bench resume        (or: python bench/resume.py [--tasks N] [--batch N])

Sets up N work units whose Create tasks were held while scheduling was paused
(bulk inserts, not measured), then measures, in the same run and against the
same Redis broker:

* baseline: the raw publish rate, ``workunits.outbox.publish`` (sign + send)
  of the same N tasks in a loop, no database;
* resume: ``workunits.scheduling.resume`` + ``workunits.resumption.run``
  (lock batches with SKIP LOCKED, join work units, apply the skip rules,
  re-sign and send, mark processed).

Prints wall time, rows/s, and resume's cost relative to the baseline.
Target: resume of 10,000 under 60 s. Sends go to the ``actuator`` list of the
Redis database in ``REDIS_URL``/``CELERY_BROKER_URL`` and are deleted
afterwards: point it at a database no worker consumes.
"""
from __future__ import annotations

import argparse
import time

from _django import bench_database
from _signals import exit_on_termination


def setup(n: int) -> list:
    from django.utils import timezone

    from experiments.models import Experiment
    from tests import factories
    from workunits.models import PausedTask, SchedulingSwitch, WorkUnit, WorkUnitExecution
    from core import convert, task_wire
    from core.protos import task_pb2

    now = timezone.now()
    exp: Experiment = factories.experiment()
    WorkUnit.objects.bulk_create(
        [WorkUnit(experiment=exp, wid=w, create_time=now, update_time=now, current_eid=1) for w in range(1, n + 1)],
        batch_size=2000)
    ids = dict(WorkUnit.objects.filter(experiment=exp).values_list("wid", "id"))
    WorkUnitExecution.objects.bulk_create(
        [WorkUnitExecution(work_unit_id=ids[w], eid=1, create_time=now, update_time=now,
                           state="SCHEDULING_PAUSED", state_update_time_ns=convert.ns_from_datetime(now))
         for w in range(1, n + 1)], batch_size=2000)
    tasks = []
    rows = []
    for w in range(1, n + 1):
        task = task_wire.sign(task_pb2.Task(
            type=task_pb2.Task.CREATE, xid=exp.id, wid=w, eid=1,
            operation_name=f"experiments/{exp.id}/workUnits/{w}/operations/{w}",
            operation_time_ns=convert.ns_from_datetime(now)))
        tasks.append(task)
        rows.append(PausedTask(task_type="CREATE", payload=task.SerializeToString(deterministic=True),
                               xid=exp.id, wid=w, eid=1, created_time=now))
    PausedTask.objects.bulk_create(rows, batch_size=2000)
    SchedulingSwitch.objects.update_or_create(id=1, defaults={"paused": True, "reason": "bench"})
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)

    with bench_database():
        import redis
        from django.conf import settings

        from workunits import outbox, resumption, scheduling
        from workunits.models import PausedTask

        broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        print(f"setting up {args.tasks} paused Create tasks ...", flush=True)
        tasks = setup(args.tasks)
        try:
            started = time.perf_counter()
            for task in tasks:
                outbox.publish(task)
            baseline = time.perf_counter() - started
            broker.delete("actuator")

            started = time.perf_counter()
            result = scheduling.resume(by="bench", batch_size=args.batch, dispatch=False)
            summary = resumption.run(result.run_id, batch_size=args.batch)
            wall = time.perf_counter() - started
            sent = broker.llen("actuator")
        finally:
            broker.delete("actuator")
            broker.close()
        assert summary.resumed == args.tasks == sent, (summary, sent)
        assert not PausedTask.objects.filter(processed_time__isnull=True).exists()

        print(f"baseline (raw publish, no database): {args.tasks} tasks in {baseline:.2f} s, "
              f"{args.tasks / baseline:,.0f} tasks/s")
        print(f"resume (batches of {args.batch}): {args.tasks} rows in {wall:.2f} s, "
              f"{args.tasks / wall:,.0f} rows/s")
        print(f"resume / raw publish time: {wall / baseline:.2f}x")
        print(f"target (< 60 s for 10,000): {'met' if wall < 60 * args.tasks / 10_000 else 'MISSED'}")


if __name__ == "__main__":
    main()
