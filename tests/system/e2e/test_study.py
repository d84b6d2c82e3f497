"""A study end to end: the unmodified client launches ``examples/study.py`` (the template unit) on the
whole system; a study created over REST runs 8 trials, 2 at a time, on the simulator (each unit's loss
computed from its own ``arg('lr')`` and ``arg('dropout')``), prunes at least one with median pruning,
and reports the best; the worker (the controller) and beat are killed mid-study and run_all restarts
them: no trial is lost, none has two units, and never more than 2 units run at once.

And from a launch script: ``examples/study_from_launch.py`` runs with ``xmanager launch`` in a
researcher's environment (the real client ``xm_cloud`` and ``clients/python`` installed side by
side, `tests.system.cli.cli_env.ensure_launch_venv`): it launches the template with ``xm_cloud``,
``xmc_study.create`` starts the study with the launch client's identity, and the study runs to its end.
"""
from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.db import close_old_connections

from experiments.models import Experiment
from studies.models import Trial
from tests.system.cli.cli_env import ensure_launch_venv
from tests.system.e2e.conftest import ROOT, System, eventually
from tests.system.e2e.test_walkthrough import _client, _rest
from tests.system.real_client.conftest import Client
from workunits.choices import TERMINAL
from workunits.models import WorkUnit, WorkUnitExecution

pytestmark = pytest.mark.django_db(transaction=True)

#: A short lease (a step the killed worker held is re-sent within seconds) and a quick tick.
SYSTEM_ENV = {"XMC_OPERATION_LEASE_S": "10", "XMC_STUDY_TICK_S": "2"}
MAX_TRIALS, PARALLEL = 8, 2


def _leader(system: System, word: str) -> psutil.Process:
    """The celery ``word`` (worker, beat) run_all started for this system (its process group's leader)."""
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            environ = proc.info["environ"] or {}
        except (psutil.Error, TypeError):
            continue
        if environ.get("XMC_RUN_DIR") == str(system.run_dir) and "celery" in cmdline and f" {word}" in cmdline \
                and os.getpgid(proc.pid) == proc.pid:
            return proc
    raise AssertionError(f"no {word} of this system is running")


def _open_units(xid: int, study_id: int) -> int:
    """How many of the study's units have not ended (a stopping one still runs)."""
    close_old_connections()
    units = WorkUnit.objects.filter(experiment_id=xid, tags__contains=[f"study:{study_id}"])
    return WorkUnitExecution.objects.filter(work_unit__in=units).exclude(state__in=TERMINAL).count()


@pytest.mark.timeout(600)
def test_it_runs_a_study_s_trials_prunes_and_survives_its_controller_dying(system: System, tmp_path: Path) -> None:
    client = _client(system, tmp_path)
    launch = client.xmanager("launch", str(ROOT / "examples" / "study.py"), "--", "--run_seconds=12",
                             timeout=180).ok()
    xid, wid = launch.result["xid"], launch.result["wid"]
    study = _rest(system, "POST", f"/v1/experiments/{xid}/studies", {
        "templateWorkUnit": wid,
        "parameters": {"lr": {"logUniform": [1e-4, 1e-1]}, "dropout": {"uniform": [0, 0.5]}},
        "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"},
        "maxTrials": MAX_TRIALS, "parallelTrials": PARALLEL, "sampler": "tpe", "seed": 3,
        "pruner": {"median": {"warmupSteps": 3, "startupTrials": 2}}})
    study_id = study["id"]
    path = f"/v1/experiments/{xid}/studies/{study_id}"
    most = 0

    def trials_started(n: int) -> Any:
        def check() -> Any:
            nonlocal most
            most = max(most, _open_units(xid, study_id))
            got = _rest(system, "GET", path)
            return got if len(got["trials"]) >= n else None
        return check

    eventually(trials_started(3), timeout=180, what="the third trial started")
    # The controller dies mid-study (the worker runs it; beat rings it): run_all starts both again.
    for word in ("worker", "beat"):
        os.killpg(_leader(system, word).pid, signal.SIGKILL)

    def finished() -> Any:
        nonlocal most
        most = max(most, _open_units(xid, study_id))
        got = _rest(system, "GET", path)
        return got if got["state"] != "RUNNING" else None

    final = eventually(finished, timeout=420, what="the study ended")
    assert final["state"] == "COMPLETED"
    assert most <= PARALLEL
    trials = final["trials"]
    assert [t["number"] for t in trials] == list(range(MAX_TRIALS))
    assert all(t["state"] in ("COMPLETED", "PRUNED") for t in trials), trials
    pruned = [t for t in trials if t["state"] == "PRUNED"]
    assert pruned and all(t["message"].startswith(f"pruned by study {study_id} at step ") for t in pruned)
    assert all(t["prunedAtStep"] >= 3 for t in pruned)
    completed = [t for t in trials if t["state"] == "COMPLETED"]
    assert final["bestTrial"]["value"] == min(t["value"] for t in completed)
    # One unit per trial, each the trial's reserved wid, tagged with its number: none lost, none twice.
    units = WorkUnit.objects.filter(experiment_id=xid, tags__contains=[f"study:{study_id}"])
    assert sorted(units.values_list("wid", flat=True)) == sorted(t["workUnit"] for t in trials)
    for unit in units:
        (number,) = [int(tag.split(":")[1]) for tag in unit.tags if tag.startswith("trial:")]
        assert Trial.objects.get(study_id=study_id, number=number).wid == unit.wid
        assert unit.args["lr"] and unit.args["dropout"]
    # Each completed trial's value is its unit's last loss, as its own arguments give it (after 8 to 14 steps).
    for t in completed:
        base = 0.5 + (math.log(t["parameters"]["lr"]) + 4.6) ** 2 / 10 + 2 * (t["parameters"]["dropout"] - 0.2) ** 2
        assert base + math.exp(-14 / 8) <= t["value"] <= base + math.exp(-8 / 8)


@pytest.mark.timeout(900)  # the first build of the launch environment takes minutes (cached after)
def test_it_runs_a_study_a_launch_script_starts_with_xm_cloud_and_xmc_study(system: System,
                                                                                 tmp_path: Path) -> None:
    workdir = tmp_path / "launch"
    workdir.mkdir()
    grpc_target = system.exports["XMANAGER_ENDPOINT"].removeprefix("http://")
    client = Client(ensure_launch_venv(), workdir, grpc_target, system.api, system.exports["XMC_AUTH_TOKEN"])
    launch = client.xmanager("launch", str(ROOT / "examples" / "study_from_launch.py"), "--", "--run_seconds=6",
                             "--max_trials=3", "--parallel=2", timeout=240).ok()
    xid, sid = launch.result["xid"], launch.result["sid"]
    assert launch.result["url"] == f"{system.api}/experiments/{xid}/studies/{sid}"
    path = f"/v1/experiments/{xid}/studies/{sid}"
    created = _rest(system, "GET", path)
    assert created["name"] == f"experiments/{xid}/studies/{sid}"
    assert created["templateWorkUnit"] == 1 and created["maxTrials"] == 3 and created["parallelTrials"] == 2
    assert set(created["parameters"]) == {"lr", "batch_size", "dropout"}
    assert created["creator"] and created["creator"] == Experiment.objects.get(id=xid).creator  # the launch's identity
    template = WorkUnit.objects.get(experiment_id=xid, wid=1)  # what xm_cloud launched, the study's template
    assert template.args["lr"] == "0.01" and not [t for t in template.tags if t.startswith("study:")]

    def ended() -> Any:
        got = _rest(system, "GET", path)
        return got if got["state"] != "RUNNING" else None

    final = eventually(ended, timeout=360, what="the launched study ended")
    assert final["state"] == "COMPLETED", final
    trials = final["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2] and all(t["state"] == "COMPLETED" for t in trials), trials
    for t in trials:  # each ran as a clone of the template with its own arguments, and reported its loss
        unit = WorkUnit.objects.get(experiment_id=xid, wid=t["workUnit"])
        assert f"study:{sid}" in unit.tags and float(unit.args["lr"]) == pytest.approx(t["parameters"]["lr"])
        assert t["value"] is not None
    assert final["bestTrial"]["value"] == min(t["value"] for t in trials)
