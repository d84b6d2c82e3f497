"""Benchmark: studies (studies/) -- the next trial's choice at 1,000 trials, and a search on the simulator's metrics.

    ./dev bench studies       (or: python bench/studies.py [--seeds 5] [--trials 40] [--parallel 4]
                                                          [--steps 30] [--decision-trials 1000]
                                                          [--decision-only] [--controller])

1. **Choosing the next trial** (target <= 200 ms): `studies.search.next_parameters` with TPE over
   ``--decision-trials`` finished trials of the issue's four-parameter space (logUniform, choice,
   uniform, int), exactly what the controller runs per new trial (rebuild an in-memory Optuna study
   from the rows, ask); p50 and max of `DECISION_CALLS` calls, beside the same decision with the random
   sampler. With ``--controller``, also the whole decision as the controller makes it on a database
   (`studies.controller.past_trials`: one query of the rows' values, no model objects; then the same
   choice) over 1,000 finished trial rows, in this process as it started and after the ``gc.freeze()``
   each worker pool process makes when it starts (`xmc.celery.freeze_startup_heap`): without it, the
   full collections the decisions' allocations set off walk the whole startup heap (the max).
2. **A search** (targets: within 10% of the optimum in >= 4 of 5 seeds; <= 60% of the unit-seconds of
   the same study without pruning): a ``--trials``-trial study, ``--parallel`` at once, each unit
   reporting ``loss`` every simulated second for ``--steps`` steps from the simulator's own metrics
   expression evaluator (`simulators.cluster.controllers.script`, ``arg('lr')``, ``arg('dropout')``).
   The loop is the controller's (start trials while slots are free; each second every running trial
   reports a point; the pruner decides at each point; a trial completes at its last step) over the
   same `studies.search` functions, in simulated time: a 40-trial study takes seconds, not the
   20 minutes it would on the simulated cluster's wall clock. Studies: TPE with median pruning,
   TPE without pruning (the baseline of unit-seconds), and random search without pruning.
3. **The real controller** (``--controller``, on a throw-away database): the TPE + median study of part 2
   for one seed, run by `studies.controller.step` itself over real work units (created and stopped
   through the work unit services, points written through the metrics write path's service, one
   point per unit per simulated second, no cluster), beside the same study without pruning: the
   controller's own decisions, rows and stops give the same kind of figures, and its time per step.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))  # _django (after the project: bench/studies.py is not the app)

from simulators.cluster.controllers.script import metric_value, parse_metrics  # noqa: E402
from studies import search  # noqa: E402
from studies.search import PastTrial  # noqa: E402

#: What every simulated unit reports each second (n: the step): the optimum is lr = 0.01, dropout = 0.2.
LOSS = "0.5+(log(arg('lr'))+4.6)**2/10+2*(arg('dropout')-0.2)**2+exp(-n/8)"
SPACE = {"lr": {"logUniform": [1e-5, 1e-1]}, "dropout": {"uniform": [0.0, 0.5]}}
ISSUE_SPACE = {"lr": {"logUniform": [1e-5, 1e-1]}, "batch_size": {"choice": [32, 64, 128]},
               "dropout": {"uniform": [0, 0.5]}, "layers": {"int": [2, 8]}}


def loss_curve(params: dict[str, Any], steps: int) -> list[float]:
    ((_, expression),) = parse_metrics(f"loss={LOSS}", {k: repr(v) for k, v in params.items()})
    return [float(metric_value(expression, float(n), n) or 0.0) for n in range(1, steps + 1)]


#: Calls each next-trial figure is the p50 and max of.
DECISION_CALLS = 20


def _timed(call: Any, calls: int = DECISION_CALLS) -> tuple[float, float]:
    """(p50, max) in ms of ``calls`` calls of ``call()``."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times)


def decision_latency(trials: int) -> dict[str, float]:
    rng = random.Random(0)
    past = [PastTrial(number=i, state="COMPLETED",
                      parameters={"lr": 10 ** rng.uniform(-5, -1), "batch_size": rng.choice([32, 64, 128]),
                                  "dropout": rng.uniform(0, 0.5), "layers": rng.randint(2, 8)},
                      value=rng.random()) for i in range(trials)]
    out: dict[str, float] = {}
    search.next_parameters(ISSUE_SPACE, "MINIMIZE", "tpe", 0, past[:10])  # imports and first-call set-up
    for sampler in ("tpe", "random"):
        out[f"{sampler}_p50"], out[f"{sampler}_max"] = _timed(
            lambda: search.next_parameters(ISSUE_SPACE, "MINIMIZE", sampler, 0, past))
    return out


def decision_from_rows(trials: int) -> tuple[float, float, float, float]:
    """(p50, max of reading the rows; p50, max of the whole decision) in ms: a TPE study of the issue's space
    with ``trials`` finished trial rows on the database, decided as `studies.controller.start_trials` does."""
    from django.utils import timezone
    from google.protobuf import json_format

    from core import pb
    from experiments import services as experiment_services
    from studies import controller, services
    from studies.models import Trial
    from workunits import services as workunit_services
    from workunits.models import WorkUnit

    exp = experiment_services.create_experiment(pb.experiment.Experiment(title="bench decision"), creator="bench@x.org")
    template = json_format.ParseDict({"executable": {"jobset": {"jobs": [{"name": "trainer", "replicas": 1, "spec": {
        "dockerImage": "gcr.io/xmc-demo/trainer:v1", "args": {"lr": "0.001"},
        "resources": {"cpuResources": {"cpuMillicores": 100, "memoryBytes": str(1 << 28)}}}}]}}},
        pb.work_unit.WorkUnit())
    wid = WorkUnit.objects.get(id=workunit_services.create_work_unit(exp.id, template).work_unit_id).wid
    study = services.create_study(exp.id, {
        "templateWorkUnit": wid, "parameters": ISSUE_SPACE, "objective": {"metric": "loss", "goal": "MINIMIZE"},
        "maxTrials": trials + 1, "parallelTrials": 1, "sampler": "tpe", "seed": 0})
    rng = random.Random(0)
    now = timezone.now()
    Trial.objects.bulk_create([Trial(
        study=study, number=i, wid=wid + 1 + i, state="COMPLETED", unit_done=True, create_time=now,
        parameters={"lr": 10 ** rng.uniform(-5, -1), "batch_size": rng.choice([32, 64, 128]),
                    "dropout": rng.uniform(0, 0.5), "layers": rng.randint(2, 8)},
        value=rng.random(), intermediate={str(step): rng.random() for step in range(1, 31)}) for i in range(trials)])

    def decide() -> None:
        search.next_trial(study.parameters, study.goal, study.sampler, study.seed,
                          controller.past_trials(study, with_steps=False))

    decide()
    return (*_timed(lambda: controller.past_trials(study, with_steps=False)), *_timed(decide))


def run_study(sampler: str, pruner: dict[str, Any] | None, seed: int, *, trials: int, parallel: int,
              steps: int) -> tuple[float, int, int]:
    """(best value, unit-seconds, trials pruned) of one study in simulated time."""
    done: list[PastTrial] = []
    running: dict[int, dict[str, Any]] = {}
    started = unit_seconds = pruned = 0
    while started < trials or running:
        while len(running) < parallel and started < trials:
            now = done + [PastTrial(n, "RUNNING", r["params"], intermediate=dict(r["inter"]))
                          for n, r in running.items()]
            params = search.next_parameters(SPACE, "MINIMIZE", sampler, seed, sorted(now, key=lambda t: t.number))
            running[started] = {"params": params, "curve": loss_curve(params, steps), "inter": {}}
            started += 1
        for number in sorted(running):
            r = running[number]
            step = len(r["inter"]) + 1
            r["inter"][step] = r["curve"][step - 1]
            unit_seconds += 1
            if step == steps:
                done.append(PastTrial(number, "COMPLETED", r["params"], value=r["curve"][-1], intermediate=dict(r["inter"])))
                del running[number]
                continue
            others = done + [PastTrial(n, "RUNNING", o["params"], intermediate=dict(o["inter"]))
                             for n, o in running.items() if n != number]
            mine = PastTrial(number, "RUNNING", r["params"], intermediate=dict(r["inter"]))
            verdict = search.should_prune(SPACE, "MINIMIZE", pruner, [*others, mine], mine)
            if verdict is not None and verdict.prune:
                done.append(PastTrial(number, "PRUNED", r["params"], intermediate=dict(r["inter"])))
                del running[number]
                pruned += 1
    best = min(t.value for t in done if t.state == "COMPLETED" and t.value is not None)
    return best, unit_seconds, pruned


def run_controller(pruner: dict[str, Any] | None, seed: int, *, trials: int, parallel: int,
                   steps: int) -> tuple[float, int, int, float]:
    """(best value, unit-seconds, pruned, mean ms per step) of one study run by the real controller."""
    from datetime import timedelta

    from django.utils import timezone
    from google.protobuf import json_format

    from core import pb
    from experiments import services as experiment_services
    from metrics import services as metric_services
    from studies import controller, services
    from studies.models import Study, Trial
    from workunits import services as workunit_services
    from workunits import state as guards
    from workunits.choices import TERMINAL
    from workunits.models import WorkUnit, WorkUnitExecution

    exp = experiment_services.create_experiment(pb.experiment.Experiment(title="bench study"), creator="bench@x.org")
    template = json_format.ParseDict({"executable": {"jobset": {"jobs": [{"name": "trainer", "replicas": 1, "spec": {
        "dockerImage": "gcr.io/xmc-demo/trainer:v1", "args": {"lr": "0.001", "dropout": "0.4"},
        "resources": {"cpuResources": {"cpuMillicores": 100, "memoryBytes": str(1 << 28)}}}}]}}},
        pb.work_unit.WorkUnit())
    wid = WorkUnit.objects.get(id=workunit_services.create_work_unit(exp.id, template).work_unit_id).wid
    study = services.create_study(exp.id, {
        "templateWorkUnit": wid, "parameters": SPACE, "objective": {"metric": "loss", "goal": "MINIMIZE"},
        "maxTrials": trials, "parallelTrials": parallel, "sampler": "tpe", "pruner": pruner, "seed": seed})
    start = timezone.now() - timedelta(hours=1)
    written: dict[int, int] = {}
    unit_seconds = steps_run = 0
    spent = 0.0

    def move(unit: WorkUnit, state: str) -> None:
        workunit_services.update_work_unit_executions([guards.ExecutionUpdate(
            xid=exp.id, wid=unit.wid, eid=unit.current_eid, mask=("status.state",), state=state,
            state_update_time_ns=time.time_ns())])

    while True:
        began = time.perf_counter()
        controller.step(study.id)
        spent += time.perf_counter() - began
        steps_run += 1
        if Study.objects.get(id=study.id).state != "RUNNING":
            break
        for trial in Trial.objects.filter(study_id=study.id, unit_done=False, work_unit__isnull=False):
            unit = WorkUnit.objects.get(id=trial.work_unit_id)
            execution = WorkUnitExecution.objects.get(work_unit=unit, eid=unit.current_eid)
            if execution.state in TERMINAL:
                continue
            if trial.state != "RUNNING":  # pruned: the unit stops when asked
                move(unit, "STOPPED")
                continue
            n = written.get(trial.id, 0) + 1
            if n == 1:
                move(unit, "RUNNING")
            value = loss_curve(trial.parameters, steps)[n - 1]
            metric_services.write_points(execution.pk, [metric_services.Point("loss", n, value,
                                                                              start + timedelta(seconds=n))])
            written[trial.id] = n
            unit_seconds += 1
            if n == steps:
                move(unit, "COMPLETED")
    best = services.best_trial(Study.objects.get(id=study.id))
    pruned = Trial.objects.filter(study_id=study.id, state="PRUNED").count()
    return (best.value if best and best.value is not None else math.inf), unit_seconds, pruned, \
        spent / max(steps_run, 1) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--decision-trials", type=int, default=1000)
    parser.add_argument("--controller", action="store_true", help="also run part 3 (the real controller, a database)")
    parser.add_argument("--decision-only", action="store_true", help="only part 1 (the next trial's choice)")
    args = parser.parse_args()

    latency = decision_latency(args.decision_trials)
    print(f"next trial over {args.decision_trials} finished trials: TPE p50 {latency['tpe_p50']:.0f} ms, "
          f"max {latency['tpe_max']:.0f} ms (target <= 200 ms); random p50 {latency['random_p50']:.0f} ms "
          f"(TPE / random {latency['tpe_p50'] / max(latency['random_p50'], 1e-9):.1f}x)")
    if args.decision_only:
        return

    optimum = loss_curve({"lr": math.exp(-4.6), "dropout": 0.2}, args.steps)[-1]
    median = {"median": {"warmupSteps": 2, "startupTrials": 4}}
    studies = (("TPE + median pruning", "tpe", median), ("TPE, no pruning", "tpe", None),
               ("random search, no pruning", "random", None))
    results: dict[str, list[tuple[float, int, int]]] = {name: [] for name, _, _ in studies}
    for seed in range(args.seeds):
        for name, sampler, pruner in studies:
            results[name].append(run_study(sampler, pruner, seed, trials=args.trials, parallel=args.parallel,
                                           steps=args.steps))
    baseline = sum(r[1] for r in results["TPE, no pruning"])
    print(f"\nknown optimum's objective (loss at step {args.steps}, lr=0.01, dropout=0.2): {optimum:.4f}; "
          f"within 10%: <= {optimum * 1.1:.4f}")
    print(f"{'study':<28} {'within 10%':>10} {'median best':>12} {'unit-s':>8} {'vs no pruning':>14} {'pruned':>7}")
    for name, _, _ in studies:
        rows = results[name]
        hits = sum(1 for best, _, _ in rows if best <= optimum * 1.1)
        seconds = sum(r[1] for r in rows)
        print(f"{name:<28} {hits:>7}/{len(rows):<2} {statistics.median(r[0] for r in rows):>12.4f} "
              f"{seconds:>8} {seconds / baseline:>13.0%} {sum(r[2] for r in rows):>7}")
    if args.controller:
        controller_runs(args, median, optimum)


def controller_runs(args: argparse.Namespace, median: dict[str, Any], optimum: float) -> None:
    os.environ["CELERY_BROKER_URL"] = "memory://"  # no broker: the bench steps the controller itself
    from _django import bench_database

    with bench_database():
        from metrics import hooks as metric_hooks
        from studies import hooks as study_hooks
        from workunits import hooks as workunit_hooks

        # Nobody rings and no page listens: the loop below steps the study itself.
        for registry in (metric_hooks.written_hooks, workunit_hooks.committed_hooks, study_hooks.changed_hooks):
            for hook in list(registry):
                registry.unregister(hook)
        plain = decision_from_rows(args.decision_trials)
        from xmc.celery import freeze_startup_heap

        freeze_startup_heap()  # what each worker pool process does when it starts (the controller runs there)
        frozen = decision_from_rows(args.decision_trials)
        pruned_run = run_controller(median, 0, trials=args.trials, parallel=args.parallel, steps=args.steps)
        plain_run = run_controller(None, 0, trials=args.trials, parallel=args.parallel, steps=args.steps)
    print(f"\nnext trial from {args.decision_trials} finished trial rows on the database, as the controller decides:")
    for name, (read_p50, read_max, whole_p50, whole_max) in (("this process as started", plain),
                                                             ("as a worker's pool process (gc.freeze)", frozen)):
        print(f"  {name:<40} p50 {whole_p50:.0f} ms, max {whole_max:.0f} ms "
              f"(reading the rows: p50 {read_p50:.0f} ms, max {read_max:.0f} ms)")
    print(f"\nthe real controller (seed 0, on a database, no cluster):")
    for name, (best, seconds, pruned, per_step) in (("TPE + median pruning", pruned_run), ("TPE, no pruning", plain_run)):
        print(f"{name:<28} best {best:.4f} ({'within' if best <= optimum * 1.1 else 'NOT within'} 10%), "
              f"{seconds} unit-s ({seconds / plain_run[1]:.0%} of no pruning), {pruned} pruned, "
              f"{per_step:.0f} ms per step")


if __name__ == "__main__":
    main()
