"""Parameter importance: ``GET /v1/experiments/{xid}:importance`` ranks the arguments of a sweep's
completed work units by how much of a metric they explain (Optuna's fANOVA evaluator).

Alice's sweep: ``lr`` (four values) moves the loss a lot, ``batch_size`` (two values) a little,
``optimizer`` (text) not at all but for a small bump; a running unit with an absurd loss must not count.
"""
from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests import factories
from tests.api.test_sweeps import _get, _no_rate_limit, _unit, _write  # noqa: F401 - the autouse fixture
from workunits import services as wu_services
from workunits.state import ExecutionUpdate

ALICE, BOB = factories.ALICE, factories.BOB
pytestmark = pytest.mark.django_db

LRS = ("0.0001", "0.001", "0.01", "0.1")
BATCHES = ("16", "256")
OPTIMIZERS = ("adam", "sgd")


def complete(xid: int, wid: int) -> None:
    """Move work unit ``wid`` through its life to COMPLETED, as the reconciler would."""
    at = timezone.now()
    for state in ("SCHEDULING", "RUNNING", "COMPLETED"):
        at += timedelta(seconds=1)
        wu_services.update_work_unit_executions([ExecutionUpdate(
            xid=xid, wid=wid, eid=1, mask=("status.state",), state=state,
            state_update_time_ns=int(at.timestamp() * 1e9))], now=at)


def loss_of(lr: str, batch: str, optimizer: str) -> float:
    return (math.log10(float(lr)) + 2) ** 2 + int(batch) / 1000 + (0.01 if optimizer == "sgd" else 0.0)


@pytest.fixture
def sweep() -> Any:
    exp = factories.experiment(ALICE, title="importance")
    wid = 0
    for lr in LRS:
        for batch in BATCHES:
            for optimizer in OPTIMIZERS:
                wid += 1
                unit = _unit(exp, wid, {"lr": lr, "batch_size": batch, "optimizer": optimizer, "epochs": "3"})
                _write(unit, "loss", [5.0, loss_of(lr, batch, optimizer)])
                complete(exp.id, wid)
    running = _unit(exp, 99, {"lr": "0.01", "batch_size": "16", "optimizer": "adam", "epochs": "3"})
    _write(running, "loss", [1e9])
    return exp


def _main_effect(rows: list[tuple[dict[str, str], float]], name: str) -> float:
    """The variance of the per-value means of ``name``: its main effect, computed here without Optuna."""
    groups: dict[str, list[float]] = {}
    for args, value in rows:
        groups.setdefault(args[name], []).append(value)
    means = [sum(v) / len(v) for v in groups.values()]
    overall = sum(means) / len(means)
    return sum((m - overall) ** 2 for m in means) / len(means)


def test_it_ranks_the_arguments_by_how_much_of_the_metric_they_explain(sweep: Any) -> None:
    status, body = _get(f"/v1/experiments/{sweep.id}:importance", metric="loss", stat="last", goal="MINIMIZE")
    assert status == 200, body
    importances = body["importances"]
    assert set(importances) == {"lr", "batch_size", "optimizer"}  # epochs never varies
    assert all(value >= 0 for value in importances.values())
    assert sum(importances.values()) == pytest.approx(1.0)
    assert body["workUnits"] == 16  # the running unit does not count
    rows = [({"lr": lr, "batch_size": b, "optimizer": o}, loss_of(lr, b, o))
            for lr in LRS for b in BATCHES for o in OPTIMIZERS]
    by_effect = sorted(importances, key=lambda name: _main_effect(rows, name), reverse=True)
    assert sorted(importances, key=importances.__getitem__, reverse=True) == by_effect
    again = _get(f"/v1/experiments/{sweep.id}:importance", metric="loss")[1]
    assert again["importances"] == importances  # seeded: the same sweep, the same answer


def test_it_gives_a_clear_answer_for_too_few_completed_units() -> None:
    exp = factories.experiment(ALICE)
    for wid, lr in ((1, "0.1"), (2, "0.2")):
        _write(_unit(exp, wid, {"lr": lr}), "loss", [float(lr)])
        complete(exp.id, wid)
    status, body = _get(f"/v1/experiments/{exp.id}:importance", metric="loss")
    assert status == 400 and body["error"]["status"] == "FAILED_PRECONDITION"
    assert "at least 4 completed work units" in body["error"]["message"] and "has 2" in body["error"]["message"]


def test_it_has_nothing_to_rank_for_a_sweep_whose_arguments_never_vary() -> None:
    exp = factories.experiment(ALICE)
    for wid in range(1, 6):
        _write(_unit(exp, wid, {"lr": "0.1"}), "loss", [float(wid)])
        complete(exp.id, wid)
    status, body = _get(f"/v1/experiments/{exp.id}:importance", metric="loss")
    assert status == 400 and "no argument takes different values" in body["error"]["message"]


@pytest.mark.parametrize(("params", "field"), [
    ({}, "metric"), ({"metric": "nope"}, "metric"), ({"metric": "loss", "stat": "median"}, "stat"),
    ({"metric": "loss", "goal": "BEST"}, "goal"),
])
def test_it_names_the_field_in_bad_requests(sweep: Any, params: dict[str, str], field: str) -> None:
    status, body = _get(f"/v1/experiments/{sweep.id}:importance", **params)
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    assert field in body["error"]["message"]


def test_it_does_not_let_a_stranger_ask(sweep: Any) -> None:
    status, body = _get(f"/v1/experiments/{sweep.id}:importance", BOB, metric="nope")
    assert status == 403
