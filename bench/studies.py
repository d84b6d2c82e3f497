"""Benchmark: studies (studies/) -- the next trial's choice at 1,000 trials, and a search on the simulator's metrics.

    ./dev bench studies       (or: python bench/studies.py [--seeds 5] [--trials 40] [--parallel 4]
                                                          [--steps 30] [--decision-trials 1000])

1. **Choosing the next trial** (target <= 200 ms): `studies.search.next_parameters` with TPE over
   ``--decision-trials`` finished trials of the issue's four-parameter space (logUniform, choice,
   uniform, int), exactly what the controller runs per new trial (rebuild an in-memory Optuna study
   from the rows, ask); p50 and max of 5 calls, beside the same decision with the random sampler.
2. **A search** (targets: within 10% of the optimum in >= 4 of 5 seeds; <= 60% of the unit-seconds of
   the same study without pruning): a ``--trials``-trial study, ``--parallel`` at once, each unit
   reporting ``loss`` every simulated second for ``--steps`` steps from the simulator's own metrics
   expression evaluator (`simulators.cluster.controllers.script`, ``arg('lr')``, ``arg('dropout')``).
   The loop is the controller's (start trials while slots are free; each second every running trial
   reports a point; the pruner decides at each point; a trial completes at its last step) over the
   same `studies.search` functions, in simulated time: a 40-trial study takes seconds, not the
   20 minutes it would on the simulated cluster's wall clock. Studies: TPE with median pruning,
   TPE without pruning (the baseline of unit-seconds), and random search without pruning.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def decision_latency(trials: int) -> dict[str, float]:
    rng = random.Random(0)
    past = [PastTrial(number=i, state="COMPLETED",
                      parameters={"lr": 10 ** rng.uniform(-5, -1), "batch_size": rng.choice([32, 64, 128]),
                                  "dropout": rng.uniform(0, 0.5), "layers": rng.randint(2, 8)},
                      value=rng.random()) for i in range(trials)]
    out: dict[str, float] = {}
    search.next_parameters(ISSUE_SPACE, "MINIMIZE", "tpe", 0, past[:10])  # imports and first-call set-up
    for sampler in ("tpe", "random"):
        times = []
        for _ in range(5):
            started = time.perf_counter()
            search.next_parameters(ISSUE_SPACE, "MINIMIZE", sampler, 0, past)
            times.append((time.perf_counter() - started) * 1000)
        out[f"{sampler}_p50"], out[f"{sampler}_max"] = statistics.median(times), max(times)
    return out


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--decision-trials", type=int, default=1000)
    args = parser.parse_args()

    latency = decision_latency(args.decision_trials)
    print(f"next trial over {args.decision_trials} finished trials: TPE p50 {latency['tpe_p50']:.0f} ms, "
          f"max {latency['tpe_max']:.0f} ms (target <= 200 ms); random p50 {latency['random_p50']:.0f} ms "
          f"(TPE / random {latency['tpe_p50'] / max(latency['random_p50'], 1e-9):.1f}x)")

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


if __name__ == "__main__":
    main()
