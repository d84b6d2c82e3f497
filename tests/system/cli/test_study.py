"""The installed ``xmc study`` commands and the ``xmc_study`` launch-script helper, against a live web server.

Alice creates a study from a work unit with the flags the issue writes, reads it back as a table and
as JSON (its trials are the rows the controller writes, made here with the page tests' study), lists
her experiment's studies and stops one. A flag that cannot work is refused before anything is sent,
with a line naming the flag; what only the server can know (a template that does not exist, someone
else's experiment) comes back as one line too. The helper runs in the command's own virtualenv (the
package a researcher installs beside the XManager client), with the launch client's identity.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from studies.models import Study
from tests import factories
from tests.system.cli.cli_env import ensure_cli_venv
from tests.system.cli.runner import ALICE, BOB, Xmc
from tests.ui.test_study_page import TRIALS, loss_of, make_study
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db(transaction=True)

CREATE = ("--param", "lr=log:1e-5:1e-1", "--param", "batch_size=choice:32,64,128", "--param", "dropout=uniform:0:0.5",
          "--param", "layers=int:2:8", "--objective", "loss:last:min", "--max-trials", "40", "--parallel", "4",
          "--sampler", "tpe", "--pruner", "median:5")


@pytest.fixture
def xmc(live_server: Any, tmp_path: Path, settings: Any) -> Xmc:
    settings.XMC_RATE_LIMIT_PER_S = 0
    return Xmc(ensure_cli_venv(), tmp_path, live_server.url)


def test_it_sends_the_search_space_the_flags_describe_in_study_create(xmc: Xmc) -> None:
    exp = factories.experiment(ALICE, title="search")
    factories.work_unit(exp)
    created = xmc("study", "create", "--from", f"{exp.id}/1", *CREATE, "--json", token=issue_token(ALICE)).ok().json
    study = Study.objects.get(experiment=exp)
    assert created["name"] == f"experiments/{exp.id}/studies/{study.id}" and created["state"] == "RUNNING"
    assert study.parameters == {"lr": {"logUniform": [1e-5, 0.1]}, "batch_size": {"choice": [32, 64, 128]},
                                "dropout": {"uniform": [0, 0.5]}, "layers": {"int": [2, 8]}}
    assert (study.metric, study.stat, study.goal) == ("loss", "last", "MINIMIZE")
    assert (study.max_trials, study.parallel_trials, study.sampler) == (40, 4, "tpe")
    assert study.pruner == {"median": {"warmupSteps": 5}} and study.template_wid == 1

    text = xmc("study", "create", "--from", f"{exp.id}/1", "--param", "lr=uniform:0.001:0.1", "--objective",
               "accuracy", token=issue_token(ALICE)).ok().stdout
    second = Study.objects.filter(experiment=exp).latest("id")
    assert f"Created study {exp.id}/{second.id}" in text and second.goal == "MAXIMIZE" and second.pruner is None


@pytest.mark.parametrize(("flags", "says"), [
    (("--param", "lr=log:0.1:1e-5"), "argument --param: parameter 'lr': empty range"),
    (("--param", "lr=log:0:1"), "argument --param: parameter 'lr': a log range must be above 0"),
    (("--param", "lr=normal:0:1"), "argument --param: parameter 'lr': unknown kind 'normal'"),
    (("--param", "layers=int:2.5:8"), "argument --param: parameter 'layers': '2.5' is not an integer"),
    (("--param", "bs=choice:"), "argument --param: parameter 'bs': choice needs values"),
    (("--param", "lr"), "argument --param: 'lr': expected NAME=KIND:..."),
    (("--param", "lr=log:1e-5:1e-1", "--objective", "loss:mean:min"), "argument --objective: objective 'loss:mean:min'"),
    (("--param", "lr=log:1e-5:1e-1", "--sampler", "bayes"), "argument --sampler: sampler 'bayes': expected one of tpe"),
    (("--param", "lr=log:1e-5:1e-1", "--pruner", "hyperband"), "argument --pruner: pruner 'hyperband': unknown pruner"),
    (("--param", "lr=log:1e-5:1e-1", "--pruner", "median:-1"), "argument --pruner: pruner 'median:-1'"),
    (("--param", "lr=log:1e-5:1e-1", "--max-trials", "0"), "argument --max-trials: must be at least 1"),
    (("--param", "lr=log:1e-5:1e-1", "--max-trials", "2", "--parallel", "3"), "argument --parallel: parallelTrials: 3"),
    (("--param", "lr=log:1e-5:1e-1", "--param", "lr=uniform:0:1"), "argument --param: 'lr' is given twice"),
    ((), "give at least one --param"),
])
def test_it_names_a_flag_that_cannot_work_and_creates_nothing(xmc: Xmc, flags: tuple[str, ...], says: str) -> None:
    exp = factories.experiment(ALICE, title="search")
    factories.work_unit(exp)
    objective = () if "--objective" in flags else ("--objective", "loss")
    run = xmc("study", "create", "--from", f"{exp.id}/1", *objective, *flags, token=issue_token(ALICE))
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not Study.objects.exists()


def test_it_says_what_only_the_server_knows_in_one_line_and_creates_nothing(xmc: Xmc) -> None:
    exp = factories.experiment(ALICE, title="search")
    factories.work_unit(exp)
    missing = xmc("study", "create", "--from", f"{exp.id}/7", "--param", "lr=log:1e-5:1e-1", "--objective", "loss",
                  token=issue_token(ALICE))
    assert missing.returncode == 4 and "templateWorkUnit" in missing.stderr, missing.stderr
    stranger = xmc("study", "create", "--from", f"{exp.id}/1", "--param", "lr=log:1e-5:1e-1", "--objective", "loss",
                   token=issue_token(BOB))
    assert stranger.returncode == 4 and "xmc:" in stranger.stderr and "Traceback" not in stranger.stderr
    assert not Study.objects.exists()
    wrong = xmc("study", "show", "12", token=issue_token(ALICE))
    assert wrong.returncode == 2 and "expected XID/SID" in wrong.stderr


def test_it_prints_the_best_trial_and_every_trial_in_study_show_and_ends_it_in_stop(xmc: Xmc) -> None:
    study = make_study()
    ref = f"{study.experiment_id}/{study.id}"
    token = issue_token(ALICE)
    shown = xmc("study", "show", ref, "--json", token=token).ok().json
    best = min((n for n, t in enumerate(TRIALS) if t[2] == "COMPLETED"), key=lambda n: loss_of(*TRIALS[n][:2]))
    assert shown["bestTrial"]["number"] == best
    assert [(t["number"], t["state"]) for t in shown["trials"]] == [(n, t[2]) for n, t in enumerate(TRIALS)]

    table = xmc("study", "show", ref, token=token, COLUMNS="120").ok().stdout
    assert f"Study {ref}" in table and "running" in table
    assert f"Best trial {best} (work unit {study.experiment_id}/{shown['bestTrial']['workUnit']}): loss" in table
    rows = [line.split() for line in table.splitlines() if any(s in line for s in (" completed ", " pruned ", " running "))
            and not line.startswith("Trials")]
    assert [r[0] for r in rows] == [f"*{n}" if n == best else str(n) for n in range(len(TRIALS))]
    assert any("step" in line and "6" in line for line in table.splitlines() if "pruned" in line)

    listed = xmc("study", "list", str(study.experiment_id), token=token).ok().stdout
    assert ref in listed and "loss" in listed
    stopped = xmc("study", "stop", ref, "--json", token=token).ok().json
    assert stopped["stopRequested"] is True
    assert Study.objects.get(id=study.id).stop_requested
    assert xmc("study", "stop", ref, token=issue_token(BOB)).returncode == 4  # not hers: not found


def test_it_lets_a_launch_script_create_a_study_with_the_helper(xmc: Xmc) -> None:
    exp = factories.experiment(ALICE, title="launched")
    factories.work_unit(exp)
    script = textwrap.dedent(
        """
        import json, sys
        import xmc_study

        class Launched:  # what xm_cloud hands the script: an experiment and a work unit with their ids
            def __init__(self, **ids):
                self.__dict__.update(ids)

        class CloudExperiment(Launched):  # xm_cloud's: its id is `id`; XManager's `experiment_id` raises
            @property
            def experiment_id(self):
                raise NotImplementedError

        experiment, unit = CloudExperiment(id=int(sys.argv[1])), Launched(work_unit_id=1)
        try:
            xmc_study.create(experiment, unit, parameters={"lr": "log:1:0.1"}, objective="loss")
        except xmc_study.SpecError as exc:
            refused = str(exc)
        study = xmc_study.create(experiment, unit, parameters={"lr": "log:1e-5:1e-1", "layers": {"int": [2, 8]}},
                                 objective="loss:last:min", max_trials=8, parallel_trials=2, pruner="median:3")
        again = xmc_study.get(experiment.id, study.sid)
        print(json.dumps({"refused": refused, "sid": study.sid, "url": study.url, "state": again.state,
                          "stopped": xmc_study.stop(experiment, study.sid).raw["stopRequested"]}))
        """)
    run = xmc_run(xmc, script, str(exp.id))
    result = json.loads(run.stdout.strip().splitlines()[-1])
    study = Study.objects.get(experiment=exp)
    assert result["sid"] == study.id and result["state"] == "RUNNING" and result["stopped"] is True
    assert result["url"].endswith(f"/experiments/{exp.id}/studies/{study.id}")
    assert "empty range" in result["refused"]
    assert study.parameters == {"lr": {"logUniform": [1e-5, 0.1]}, "layers": {"int": [2, 8]}}
    assert (study.max_trials, study.parallel_trials, study.pruner) == (8, 2, {"median": {"warmupSteps": 3}})


def xmc_run(xmc: Xmc, script: str, *args: str) -> Any:
    import subprocess

    from tests.system.cli.runner import Run

    done = subprocess.run([str(xmc.venv / "bin" / "python"), "-c", script, *args], env=xmc.env(issue_token(ALICE)),
                          capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    return Run(done.returncode, done.stdout, done.stderr).ok()
