"""``xmc usage`` and ``xmc queues`` against the whole system (``./dev run``: workers, reconciler, the simulator).

Alice's work units run to completion on the simulated cluster: their CPU-hours appear in
``xmc usage`` (the running intervals the reconciler's state history recorded), and only hers.
In the small demo queue (4 CPUs) one long job holds the quota and the next waits: ``xmc
queues`` shows Kueue's counts and the waiting work unit by name, with its owner.
"""
from __future__ import annotations

from typing import Any

from tests import waiting
from tests.system.cli import rest
from tests.system.cli.conftest import cli_venv, tokens, xmc  # noqa: F401 - fixtures
from tests.system.cli.runner import ALICE, BOB, Xmc
from tests.fixtures.systems import System


def eventually(check: Any, what: str, timeout: float = 120.0) -> Any:
    return waiting.eventually(check, timeout, what, interval=1.0)


def test_it_shows_the_cpu_hours_of_my_finished_work_in_usage(xmc: Xmc, system: System,  # noqa: F811
                                                       tokens: dict[str, str]) -> None:
    xid = rest.experiment(system.api, tokens[ALICE], "usage story",
                          [rest.work_unit("pull=1s;run=4s;exit=0", cpu_millicores=2000) for _ in range(2)])

    def finished() -> Any:
        units = xmc("status", str(xid), "--json", token=tokens[ALICE]).ok().json["workUnits"]
        return len(units) == 2 and all(u["state"] == "COMPLETED" for u in units)
    eventually(finished, "both work units completed", timeout=150)

    run = xmc("usage", "--by", "experiment", "--json", token=tokens[ALICE]).ok()
    row = next(r for r in run.json["rows"] if r["experiment"] == f"experiments/{xid}")
    assert row["executions"] == 2 and row["gpuHours"] == 0
    assert 2 * 2 * 3 / 3600 <= row["cpuHours"] <= 2 * 2 * 60 / 3600      # 2 CPUs for ~4 s, twice
    table = xmc("usage", token=tokens[ALICE], COLUMNS="120").ok().stdout
    assert ALICE in table and "total" in table
    assert xmc("usage", "--json", token=tokens[BOB]).ok().json["rows"] == [] or all(
        r["owner"] == BOB for r in xmc("usage", "--json", token=tokens[BOB]).ok().json["rows"])
    bad = xmc("usage", "--since", "yesterday", token=tokens[ALICE])
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_it_shows_kueues_numbers_and_who_waits_in_queues(xmc: Xmc, system: System,  # noqa: F811
                                                  tokens: dict[str, str]) -> None:
    xid = rest.experiment(system.api, tokens[ALICE], "queue story", [
        rest.work_unit("pull=1s;run=600s;exit=0", queue="demo-queue", cpu_millicores=4000),
        rest.work_unit("pull=1s;run=5s;exit=0", queue="demo-queue", cpu_millicores=4000)])

    def waiting_one() -> Any:
        run = xmc("queues", "demo-cluster-queue", "--json", token=tokens[ALICE]).ok()
        (cq,) = run.json["clusterQueues"]
        return cq if cq["admittedWorkloads"] == 1 and cq["pendingWorkloads"] == 1 and cq["pending"] else None
    cq = eventually(waiting_one, "one admitted, one pending in demo-cluster-queue")
    cpu = next(r for r in cq["resources"] if r["resource"] == "cpu")
    assert (cpu["nominalQuota"], cpu["usage"]) == ("4", "4")
    (pending,) = cq["pending"]
    assert pending["workUnit"] == f"experiments/{xid}/workUnits/2" and pending["owner"] == ALICE
    assert pending["localQueue"] == "demo-queue" and pending["positionInClusterQueue"] == 0

    text = xmc("queues", token=tokens[ALICE], COLUMNS="120").ok().stdout
    assert "demo-cluster-queue  1 admitted, 1 pending" in text and f"{xid}/2" in text
    assert "cluster-queue" in text
    rest.call(system.api, tokens[ALICE], "POST", f"/v1/experiments/{xid}/workUnits/1:stop", {})
    missing = xmc("queues", "no-such-queue", token=tokens[ALICE])
    assert missing.returncode == 4 and "no-such-queue not found" in missing.stderr
