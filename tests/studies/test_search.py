"""Optuna over our rows chooses what Optuna itself chooses: the rebuild's shortcuts (no copies of the
trials, the TPE search space worked out by name) change how fast a decision is, never what it is.

The reference is Optuna's public path, untouched: ``optuna.create_study`` with a plain
``TPESampler(seed=...)``, ``add_trials`` of ``optuna.trial.create_trial`` (validated, deep-copied) and
``ask(fixed_distributions=...)``.
"""
from __future__ import annotations

import random
from typing import Any

import optuna
import pytest

from studies import search
from studies.search import PastTrial

SPACE = {"lr": {"logUniform": [1e-5, 1e-1]}, "batch_size": {"choice": [32, 64, 128]},
         "dropout": {"uniform": [0, 0.5]}, "layers": {"int": [2, 8]}, "fixed": {"choice": ["x"]}}
STATES = {"COMPLETED": optuna.trial.TrialState.COMPLETE, "PRUNED": optuna.trial.TrialState.PRUNED,
          "FAILED": optuna.trial.TrialState.FAIL, "RUNNING": optuna.trial.TrialState.RUNNING}


def _rows(n: int, seed: int, *, mixed: bool, partial: bool) -> list[PastTrial]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        state = rng.choice(["COMPLETED"] * 5 + ["RUNNING", "PRUNED", "FAILED"]) if mixed else "COMPLETED"
        params: dict[str, Any] = {"lr": 10 ** rng.uniform(-5, -1), "batch_size": rng.choice([32, 64, 128]),
                                  "dropout": rng.uniform(0, 0.5), "layers": rng.randint(2, 8), "fixed": "x"}
        if partial and rng.random() < 0.2:  # a row without one parameter (the intersection drops it)
            del params["dropout"]
        rows.append(PastTrial(number=i, state=state, parameters=params,
                              value=rng.random() if state == "COMPLETED" else None,
                              intermediate={"1": rng.random()} if state in ("PRUNED", "RUNNING") else {}))
    return rows


def _optunas_own(rows: list[PastTrial], goal: str, seed: int) -> dict[str, Any]:
    dists = search.distributions(SPACE)
    study = optuna.create_study(direction="minimize" if goal == "MINIMIZE" else "maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed + len(rows)))
    study.add_trials([optuna.trial.create_trial(
        state=STATES[r.state], value=r.value if r.state == "COMPLETED" else None,
        params=dict(r.parameters), distributions={k: dists[k] for k in r.parameters},
        intermediate_values={int(k): v for k, v in r.intermediate.items()}) for r in rows])
    return study.ask(fixed_distributions=dists).params


@pytest.mark.parametrize(("n", "mixed", "partial"), [(0, False, False), (5, True, False), (12, False, False),
                                                     (60, True, False), (60, True, True), (200, False, False)])
@pytest.mark.parametrize("goal", ["MINIMIZE", "MAXIMIZE"])
def test_it_chooses_the_next_trial_optuna_itself_would_from_the_same_rows(n: int, mixed: bool, partial: bool,
                                                                          goal: str) -> None:
    rows = _rows(n, seed=n, mixed=mixed, partial=partial)
    for seed in (0, 7):
        assert search.next_parameters(SPACE, goal, "tpe", seed, rows) == _optunas_own(rows, goal, seed)


def test_it_keeps_the_startup_heap_of_a_worker_pool_process_out_of_full_collections() -> None:
    """The decisions run in Celery's pool processes: each freezes what it started with (``xmc.celery``),
    so the full collections a decision's 1,000 rebuilt trials set off scan only what tasks allocated."""
    import gc

    from celery import signals

    import xmc.celery  # noqa: F401 - connects the handler

    assert gc.get_freeze_count() == 0
    try:
        signals.worker_process_init.send(sender=None)
        assert gc.get_freeze_count() > 10_000  # Django, the apps, Optuna: the whole startup heap
    finally:
        gc.unfreeze()
