"""Benchmark: the sweep read (``workUnits:summarize``) over 100,000 work units with 10 metrics each.

    ./dev bench sweeps        (or: python bench/sweeps.py [--units 100000] [--metrics 10] [--calls 30]
                                                         [--importance-units 1000])

On a throw-away database, an experiment of ``--units`` work units (a sweep of ``lr`` x
``batch_size`` plus a per-unit ``seed``), each with ``--metrics`` metric summaries written
directly (no points: the read never reads one). Server time of
``GET /v1/experiments/<xid>/workUnits:summarize`` through Django's test client in this process (no
network; authentication, the read and the JSON included), p50 and p95 of ``--calls`` calls for:

* **first page**: default order (wid), every metric (target p95 <= 300 ms);
* **ordered by a metric**: ``orderBy=metrics.loss.last`` (target <= 500 ms);
* **filtered by an argument**: ``filter=args.lr = 0.01`` (target <= 500 ms);
* **a later page**: the tenth page of the metric order (keyset: no offsets);
* **ordered by state**, **filtered by state** and **ordered by an argument** (target <= 300 ms, as
  the experiment page's sorts);
* **parameter importance** (``:importance?metric=loss``, Optuna's fANOVA) over a second sweep of
  ``--importance-units`` completed units (target <= 2 s).

The baseline in the same run is ListWorkUnits' first page of the same units (``pageSize=100``) over
the same client; each line prints its ratio to it. The first call in the process is printed apart.
The main sweep's units are RUNNING, COMPLETED, FAILED or SCHEDULING in turn (orders and filters on
``state`` read the work unit's own indexed column).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from _django import bench_database
from _signals import exit_on_termination

METRICS = ("loss", "accuracy", "val/loss", "val/accuracy", "grad_norm", "lr_now", "throughput", "tokens",
           "perplexity", "wall_s")
LRS = ("0.0001", "0.0003", "0.001", "0.003", "0.01", "0.03", "0.1", "0.3", "1", "3")
BATCHES = ("16", "32", "64", "128", "256")
OWNER = "bench@example.com"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


#: The states of the main sweep's units, by wid (the importance sweep's are all COMPLETED).
MIXED = ("RUNNING", "COMPLETED", "FAILED", "SCHEDULING")


def build(units: int, metrics: int, mixed: bool = False) -> int:
    """An experiment of ``units`` COMPLETED work units (``mixed``: in each of `MIXED` in turn) with
    ``metrics`` summaries each; its xid."""
    from django.db import connection, transaction

    from experiments.models import Experiment
    from metrics.models import MetricSummary
    from tests import factories
    from workunits.models import WorkUnit, WorkUnitExecution
    from workunits.services import argument_stats

    exp = factories.experiment(title="sweep bench")
    template = factories.work_unit(exp, wid=1)
    execution = WorkUnitExecution.objects.get(work_unit=template)
    wu_columns = [f.column for f in WorkUnit._meta.concrete_fields if not f.primary_key and f.column not in ("wid", "args")]
    ex_columns = [f.column for f in WorkUnit._meta.get_field("executions").related_model._meta.concrete_fields
                  if not f.primary_key and f.column not in ("work_unit_id", "state")]
    lrs = "ARRAY[" + ", ".join(f"'{v}'" for v in LRS) + "]"
    batches = "ARRAY[" + ", ".join(f"'{v}'" for v in BATCHES) + "]"
    names = "ARRAY[" + ", ".join(f"'{m}'" for m in METRICS[:metrics]) + "]"
    started = time.monotonic()
    with transaction.atomic(), connection.cursor() as cursor:
        # The template is work unit 1 (its args set below); the others are copies of it.
        cursor.execute(f"UPDATE {WorkUnit._meta.db_table} SET args = jsonb_build_object('lr', %s::text, "
                       "'batch_size', %s::text, 'epochs', '10', 'seed', '1') WHERE id = %s",
                       [LRS[1], BATCHES[0], template.pk])
        cursor.execute(f"UPDATE {WorkUnitExecution._meta.db_table} SET state = 'COMPLETED' WHERE id = %s", [execution.pk])
        cursor.execute(
            f"INSERT INTO {WorkUnit._meta.db_table} ({', '.join(wu_columns)}, wid, args) "
            f"SELECT {', '.join('t.' + c for c in wu_columns)}, g, jsonb_build_object("
            f"'lr', ({lrs})[1 + g %% {len(LRS)}], 'batch_size', ({batches})[1 + (g / {len(LRS)}) %% {len(BATCHES)}], "
            "'epochs', '10', 'seed', g::text) "
            f"FROM jsonb_populate_record(NULL::{WorkUnit._meta.db_table}, %s::jsonb) t, generate_series(2, %s) g",
            [json.dumps(_row(template, wu_columns)), units])
        cursor.execute(
            f"INSERT INTO {WorkUnitExecution._meta.db_table} ({', '.join(ex_columns)}, work_unit_id, state) "
            f"SELECT {', '.join('t.' + c for c in ex_columns)}, w.id, 'COMPLETED' "
            f"FROM jsonb_populate_record(NULL::{WorkUnitExecution._meta.db_table}, %s::jsonb) t, "
            f"{WorkUnit._meta.db_table} w WHERE w.experiment_id = %s AND w.id <> %s",
            [json.dumps(_row(execution, ex_columns)), exp.id, template.pk])
        kinds = MIXED if mixed else ("COMPLETED",)
        states = "ARRAY[" + ", ".join(f"'{v}'" for v in kinds) + "]"
        cursor.execute(f"UPDATE {WorkUnitExecution._meta.db_table} x SET state = ({states})[1 + w.wid %% {len(kinds)}] "
                       f"FROM {WorkUnit._meta.db_table} w WHERE x.work_unit_id = w.id AND w.experiment_id = %s", [exp.id])
        cursor.execute(  # each unit's copy of its execution's state, as the write path keeps it
            f"UPDATE {WorkUnit._meta.db_table} w SET current_state = x.state, current_start = x.create_time, "
            "current_end = CASE WHEN x.state IN ('COMPLETED', 'FAILED') THEN now() END "
            f"FROM {WorkUnitExecution._meta.db_table} x WHERE x.work_unit_id = w.id AND w.experiment_id = %s", [exp.id])
        cursor.execute(f"UPDATE {WorkUnit._meta.db_table} SET arg_numbers = (SELECT jsonb_object_agg(key, value::float8) "
                       "FROM jsonb_each_text(args)) WHERE experiment_id = %s", [exp.id])
        # Summaries: loss is lowest near lr = 0.01 and grows with the batch size; the others are noise.
        cursor.execute(
            f"INSERT INTO {MetricSummary._meta.db_table} (work_unit_id, eid, metric, experiment_id, last, last_step, "
            "min, max, count, first_time, last_time) "
            "SELECT w.id, 1, m.name, w.experiment_id, v.last, 1000, v.last * 0.9, v.last * 3 + 1, 1001, "
            "now() - interval '1 hour', now() "
            f"FROM {WorkUnit._meta.db_table} w CROSS JOIN unnest({names}::text[]) AS m(name) "
            "CROSS JOIN LATERAL (SELECT CASE WHEN m.name = 'loss' THEN power(ln((w.args->>'lr')::float8) + 4.6, 2) / 10 "
            "+ (w.args->>'batch_size')::float8 / 1000 + w.wid * 1e-9 ELSE random() END AS last) v "
            "WHERE w.experiment_id = %s",
            [exp.id])
        argument_stats.refresh(exp.id)  # what the create path keeps for the copies' arguments
        cursor.execute(f"SELECT current_state, count(*) FROM {WorkUnit._meta.db_table} WHERE experiment_id = %s "
                       "GROUP BY current_state", [exp.id])
        Experiment.objects.filter(id=exp.id).update(child_state_counts=dict(cursor.fetchall()), last_wid=units,
                                                    creator=OWNER, acls={"owners": [{"user": OWNER}]})
        cursor.execute("ANALYZE")
    print(f"created {units} work units x {metrics} metric summaries in {time.monotonic() - started:.1f} s",
          flush=True)
    return exp.id


def _row(obj: Any, columns: list[str]) -> dict[str, Any]:
    """``obj``'s values of ``columns`` as JSON, for jsonb_populate_record (the template of every copy)."""
    out: dict[str, Any] = {}
    for f in type(obj)._meta.concrete_fields:
        if f.column in columns:
            value = getattr(obj, f.attname)
            out[f.column] = value.isoformat() if hasattr(value, "isoformat") else value
    return out


def timed(call: Callable[[], Any], calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--importance-units", type=int, default=1000)
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)

    with bench_database():
        from django.conf import settings
        from django.test import Client

        from xmc.auth.tokens import issue_token

        settings.XMC_RATE_LIMIT_PER_S = 0
        settings.ALLOWED_HOSTS = ["*"]
        xid = build(args.units, args.metrics, mixed=True)
        client = Client(HTTP_AUTHORIZATION=f"Bearer {issue_token(OWNER)}")

        def get(path: str, **params: Any) -> Any:
            answer = client.get(path + ("?" + urllib.parse.urlencode(params) if params else ""))
            assert answer.status_code == 200, answer.content[:500]
            return json.loads(answer.content)

        summarize = f"/v1/experiments/{xid}/workUnits:summarize"
        started = time.perf_counter()
        first = get(summarize)
        cold = time.perf_counter() - started
        assert first["totalSize"] == args.units and len(first["workUnits"]) == 100
        assert len(first["metrics"]) == args.metrics, first["metrics"]
        base = timed(lambda: get(f"/v1/experiments/{xid}/workUnits", pageSize=100), args.calls)
        base_p95 = pct(base, .95)
        print(f"summarize, {args.units} units x {args.metrics} metrics, 100 a page; p50 / p95 of {args.calls} calls "
              f"(first call in the process: {cold * 1000:.0f} ms)")

        ordered = get(summarize, orderBy="metrics.loss.last")["workUnits"]
        losses = [row["metrics"]["loss"]["last"] for row in ordered]
        assert losses == sorted(losses) and ordered[0]["args"]["lr"] == "0.01", ordered[0]
        filtered = get(summarize, filter="args.lr = 0.01")
        assert filtered["totalSize"] == args.units // len(LRS), filtered["totalSize"]
        token = ""
        for _ in range(9):
            token = get(summarize, orderBy="metrics.loss.last", pageToken=token)["nextPageToken"]
        cases: list[tuple[str, str, dict[str, Any]]] = [
            ("first page", "300", {}),
            ("ordered by metrics.loss.last", "500", {"orderBy": "metrics.loss.last"}),
            ("filtered by args.lr = 0.01", "500", {"filter": "args.lr = 0.01"}),
            ("filtered and ordered", "500", {"filter": "args.lr = 0.01", "orderBy": "metrics.loss.last desc"}),
            ("tenth page of the metric order", "500", {"orderBy": "metrics.loss.last", "pageToken": token}),
            ("ordered by state", "300", {"orderBy": "state"}),
            ("filtered by state = FAILED", "300", {"filter": "state = FAILED"}),
            ("ordered by args.lr desc", "300", {"orderBy": "args.lr desc"}),
        ]
        for label, target, params in cases:
            times = timed(lambda: get(summarize, **params), args.calls)
            p95 = pct(times, .95)
            print(f"  {label:<32} p50 {statistics.median(times) * 1000:5.0f} ms  p95 {p95 * 1000:5.0f} ms "
                  f"(target {target} ms: {'met' if p95 * 1000 <= int(target) else 'NOT met'})  "
                  f"{p95 / base_p95:.2f}x the baseline")
        print(f"  baseline ListWorkUnits first page (100) p50 {statistics.median(base) * 1000:5.0f} ms  "
              f"p95 {base_p95 * 1000:5.0f} ms")

        # Parameter importance (fANOVA) over a sweep of --importance-units completed units.
        small = build(args.importance_units, args.metrics)
        found = get(f"/v1/experiments/{small}:importance", metric="loss")
        assert max(found["importances"], key=found["importances"].get) == "lr", found
        times = timed(lambda: get(f"/v1/experiments/{small}:importance", metric="loss"), max(3, args.calls // 5))
        print(f"importance over {args.importance_units} completed units: p50 {statistics.median(times) * 1000:.0f} ms"
              f"  max {max(times) * 1000:.0f} ms (target 2 s: {'met' if max(times) <= 2 else 'NOT met'}); "
              f"{', '.join(f'{k} {v:.2f}' for k, v in sorted(found['importances'].items(), key=lambda kv: -kv[1]))}")


if __name__ == "__main__":
    main()
