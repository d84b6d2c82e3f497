"""A sweep end to end: the unmodified client launches ``examples/sweep.py`` on the whole system;
each simulated unit reports a loss computed from its own arguments (``arg('lr')``); the sweep read
ranks the units, parameter importance puts ``lr`` first, and ``xmc compare`` agrees -- all checked
against values computed here from each unit's arguments and last step.
"""
from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.system.cli.cli_env import ensure_cli_venv
from tests.system.cli.runner import Xmc
from tests.system.e2e.conftest import ROOT, System, eventually
from tests.system.e2e.test_walkthrough import _client

pytestmark = pytest.mark.django_db(transaction=True)

RUN_SECONDS = 10


def _get(system: System, path: str, **params: Any) -> Any:
    url = f"{system.api}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {system.exports['XMC_AUTH_TOKEN']}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def expected_loss(args: dict[str, str], last_step: int) -> float:
    """What the simulator computed for the unit's last point (examples/sweep.py's LOSS at t = step s)."""
    lr, batch = float(args["lr"]), float(args["batch_size"])
    return (math.log(lr) + 4.6) ** 2 / 10 + batch / 1000 + math.exp(-last_step / 20)


def _main_effect(rows: list[tuple[dict[str, str], float]], name: str) -> float:
    groups: dict[str, list[float]] = {}
    for args, value in rows:
        groups.setdefault(args[name], []).append(value)
    means = [sum(v) / len(v) for v in groups.values()]
    return sum((m - sum(means) / len(means)) ** 2 for m in means) / len(means)


@pytest.mark.timeout(480)
def test_it_ranks_explains_and_compares_a_launched_sweep(system: System, tmp_path: Path) -> None:
    client = _client(system, tmp_path)
    launch = client.xmanager("launch", str(ROOT / "examples" / "sweep.py"), "--", f"--run_seconds={RUN_SECONDS}",
                             timeout=180).ok()
    xid = launch.result["xid"]
    wids = launch.result["wids"]
    assert len(wids) == 8
    summarize = f"/v1/experiments/{xid}/workUnits:summarize"

    def settled() -> list[dict[str, Any]] | None:
        """Every unit COMPLETED with its points all in (steps 1..n, none missing), twice in a row."""
        rows = _get(system, summarize)["workUnits"]
        done = len(rows) == 8 and all(
            r["state"] == "COMPLETED" and "loss" in r["metrics"]
            and r["metrics"]["loss"]["count"] == r["metrics"]["loss"]["lastStep"] >= RUN_SECONDS - 2 for r in rows)
        if not done:
            return None
        time.sleep(3)
        return rows if _get(system, summarize)["workUnits"] == rows else None

    rows = eventually(settled, timeout=300, what="every unit completed with all its points")
    # Each unit's last loss is what its own arguments give (arg('lr'), arg('batch_size')).
    for row in rows:
        assert row["jobName"] == "trainer" and wids[f"{row['args']['lr']}/{row['args']['batch_size']}"] == row["workUnitId"]
        assert row["metrics"]["loss"]["last"] == pytest.approx(expected_loss(row["args"], row["metrics"]["loss"]["lastStep"]))
    expected = sorted(rows, key=lambda r: expected_loss(r["args"], r["metrics"]["loss"]["lastStep"]))
    ranking = [r["workUnitId"] for r in expected]

    # The sweep read ranks them so, and filters by an argument as a number.
    ranked = _get(system, summarize, orderBy="metrics.loss.last", metrics="loss")
    assert [r["workUnitId"] for r in ranked["workUnits"]] == ranking
    assert ranked["argsInCommon"] == {"epochs": "3"} and ranked["varyingArgs"] == ["batch_size", "lr"]
    best_lr = _get(system, summarize, filter="args.lr = 1e-2", orderBy="metrics.loss.last")
    assert [r["workUnitId"] for r in best_lr["workUnits"]] == [w for w in ranking if w in (wids["0.01/16"], wids["0.01/256"])]

    # Importance: lr explains most of the loss, in the order of the main effects computed here.
    found = _get(system, f"/v1/experiments/{xid}:importance", metric="loss", stat="last", goal="MINIMIZE")
    importances = found["importances"]
    assert set(importances) == {"lr", "batch_size"} and sum(importances.values()) == pytest.approx(1.0)
    values = [(r["args"], expected_loss(r["args"], r["metrics"]["loss"]["lastStep"])) for r in rows]
    by_effect = sorted(importances, key=lambda name: _main_effect(values, name), reverse=True)
    assert by_effect[0] == "lr" and sorted(importances, key=importances.__getitem__, reverse=True) == by_effect

    # xmc compare prints the same ranking.
    xmc = Xmc(ensure_cli_venv(), tmp_path, system.api)
    compared = xmc("compare", str(xid), "--metric", "loss", "--json", token=system.exports["XMC_AUTH_TOKEN"]).ok().json
    assert [r["workUnitId"] for r in compared["workUnits"]] == ranking
    top = xmc("compare", str(xid), "--top", "1", token=system.exports["XMC_AUTH_TOKEN"]).ok().stdout
    assert f" {ranking[0]} " in top.splitlines()[1] and "trainer" in top
