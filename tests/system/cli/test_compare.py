"""The installed ``xmc compare`` and ``xmc status`` over a sweep, against a live web server.

Alice's sweep of ``lr`` x ``batch_size``: each unit wrote a ``loss`` and an ``accuracy``; ``compare``
ranks them best first (the order is computed here from the values written), as a table, JSON and
CSV; ``status`` shows each unit's job name and the last values of its metrics.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import pytest

from tests import factories
from tests.api.test_sweeps import _unit, _write
from tests.system.cli.cli_env import ensure_cli_venv
from tests.system.cli.runner import ALICE, BOB, Xmc
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db(transaction=True)

LRS = ("0.0001", "0.001", "0.01", "0.1", "1")
BATCHES = ("16", "64")


def loss_of(lr: str, batch: str) -> float:
    return (math.log(float(lr)) + 4.6) ** 2 / 10 + int(batch) / 1000


@pytest.fixture
def sweep(settings: Any) -> Any:
    settings.XMC_RATE_LIMIT_PER_S = 0
    exp = factories.experiment(ALICE, title="lr x batch")
    wid = 0
    for lr in LRS:
        for batch in BATCHES:
            wid += 1
            unit = _unit(exp, wid, {"lr": lr, "batch_size": batch, "epochs": "5"}, job="trainer")
            _write(unit, "loss", [9.0, loss_of(lr, batch)])
            _write(unit, "accuracy", [1 - loss_of(lr, batch) / 10])
    _unit(exp, 99, {"lr": "0.5", "batch_size": "16", "epochs": "5"}, job="eval")  # no metrics yet
    return exp


@pytest.fixture
def xmc(live_server: Any, tmp_path: Path) -> Xmc:
    return Xmc(ensure_cli_venv(), tmp_path, live_server.url)


def expected_ranking() -> list[tuple[int, float]]:
    rows = [(i * len(BATCHES) + j + 1, loss_of(lr, b)) for i, lr in enumerate(LRS) for j, b in enumerate(BATCHES)]
    return sorted(rows, key=lambda r: r[1])


def test_it_ranks_the_units_by_the_loss_best_first_in_compare(xmc: Xmc, sweep: Any) -> None:
    token = issue_token(ALICE)
    result = xmc("compare", str(sweep.id), "--json", token=token).ok().json
    assert result["metric"] == "loss" and result["goal"] == "min"  # the loss-like metric, lower is better
    got = [(row["workUnitId"], row["metrics"]["loss"]["last"]) for row in result["workUnits"]]
    assert [wid for wid, _ in got] == [wid for wid, _ in expected_ranking()]
    assert [v for _, v in got] == pytest.approx([v for _, v in expected_ranking()])
    assert result["matching"] == 10 and result["argsInCommon"] == {"epochs": "5"}  # wid 99 has no loss
    top = xmc("compare", str(sweep.id), "--metric", "accuracy", "--top", "3", "--json", token=token).ok().json
    assert top["goal"] == "max" and [r["workUnitId"] for r in top["workUnits"]] == [w for w, _ in expected_ranking()[:3]]
    worst = xmc("compare", str(sweep.id), "--metric", "loss:max", "--top", "1", "--json", token=token).ok().json
    assert [r["workUnitId"] for r in worst["workUnits"]] == [expected_ranking()[-1][0]]


def test_it_filters_and_prints_a_table_and_csv_in_compare(xmc: Xmc, sweep: Any) -> None:
    token = issue_token(ALICE)
    table = xmc("compare", str(sweep.id), "--filter", "args.batch_size = 64", token=token).ok().stdout
    lines = [c for c in (line.split() for line in table.splitlines()[1:]) if len(c) > 2 and c[0].isdigit() and c[1].isdigit()]
    wanted = [w for w, _ in expected_ranking() if w % 2 == 0]
    assert [int(cells[1]) for cells in lines] == wanted and all(cells[2] == "trainer" for cells in lines)
    assert "5 of 5 work units with loss, best first" in table
    text = xmc("compare", str(sweep.id), "--csv", "--top", "4", token=token).ok().stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [int(r["wid"]) for r in rows] == [w for w, _ in expected_ranking()[:4]]
    assert {"args.lr", "args.batch_size", "loss.last", "loss.min", "accuracy.last"} <= set(rows[0])
    assert float(rows[0]["loss.last"]) == pytest.approx(expected_ranking()[0][1], rel=1e-5)


def test_it_says_what_is_wrong_in_compare(xmc: Xmc, sweep: Any) -> None:
    token = issue_token(ALICE)
    run = xmc("compare", str(sweep.id), "--metric", "nope", token=token)
    assert run.returncode == 4 and "no metric 'nope'" in run.stderr and "accuracy, loss" in run.stderr
    run = xmc("compare", str(sweep.id), "--filter", "args.colour = red", token=token)
    assert run.returncode == 4 and "args.colour" in run.stderr
    run = xmc("compare", str(sweep.id), token=issue_token(BOB))
    assert run.returncode == 4


def test_it_shows_job_names_and_the_last_values_in_status(xmc: Xmc, sweep: Any) -> None:
    token = issue_token(ALICE)
    result = xmc("status", str(sweep.id), "--json", token=token).ok().json
    assert result["metrics"] == ["loss", "accuracy"]
    units = {u["wid"]: u for u in result["workUnits"]}
    assert units[99]["jobName"] == "eval" and units[99]["metrics"] == {}
    assert units[3]["jobName"] == "trainer"
    assert units[3]["metrics"]["loss"]["last"] == pytest.approx(loss_of("0.001", "16"))
    text = xmc("status", str(sweep.id), token=token, COLUMNS="160").ok().stdout
    assert "JOB" in text and "loss" in text and "accuracy" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["3", "trainer"])
    assert f"{loss_of('0.001', '16'):.4g}" in row


def test_it_shows_each_units_gpu_cpu_and_memory_in_status_system(xmc: Xmc, sweep: Any) -> None:
    """``xmc status --system``: the last system metrics XMC recorded for each unit (issue 41 item 3)."""
    unit = sweep.work_units.get(wid=1)
    _write(unit, "system/gpu_utilization", [0.91, 0.02])
    _write(unit, "system/gpu_memory_used_bytes", [40 * 2**30])
    _write(unit, "system/cpu_usage_cores", [3.5])
    _write(unit, "system/memory_working_set_bytes", [12.5 * 2**30])
    token = issue_token(ALICE)
    table = xmc("status", f"{sweep.id}/1", "--system", token=token).ok().stdout
    header = next(line for line in table.splitlines() if "GPU MEM" in line).split()
    assert header[:7] == ["WID", "STATE", "GPU", "GPU", "MEM", "CPU", "MEM"]
    row = next(line for line in table.splitlines() if line.split()[:1] == ["1"])
    assert "initializing" in row and row.split("initializing")[1].split()[:6] == ["2%", "40.0", "GiB", "3.50", "12.5",
                                                                                 "GiB"]
    data = xmc("status", str(sweep.id), "--system", "--json", token=token).ok().json
    (first,) = [u for u in data["workUnits"] if u["wid"] == 1]
    assert first["metrics"]["system/gpu_utilization"]["last"] == pytest.approx(0.02)
    assert data["metrics"] == ["system/gpu_utilization", "system/gpu_memory_used_bytes", "system/cpu_usage_cores",
                               "system/memory_working_set_bytes"]
