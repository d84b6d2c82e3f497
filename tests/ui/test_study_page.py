"""The study page through Django's test client: its trials table (sorted and paginated in the
database), best trial, history data, parallel coordinates and parameter importance over its trials.

A study is made with the studies app's own service (``studies.services.create_study``); its trials
are the rows the controller would write (a reserved wid, a work unit made with the trial's arguments
merged into the template's, the objective when it ended), and the completed ones' units wrote
``loss`` through the real write path and moved to COMPLETED as the reconciler moves them, so parameter
importance reads what it reads on a real study.
"""
from __future__ import annotations

import html
import json
import math
import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from studies import services as study_services
from experiments.models import Experiment
from studies.models import Study, Trial
from tests import factories
from tests.ui import pages
from tests.ui.test_sweep_table import _write
from workunits import services
from workunits.models import WorkUnit

pytestmark = pytest.mark.django_db

ALICE = "alice@example.com"
#: (lr, batch_size, state, pruned at step) of each trial, by number.
TRIALS = (("0.1", 32, "COMPLETED", None), ("0.01", 64, "COMPLETED", None), ("0.001", 128, "COMPLETED", None),
          ("0.03", 32, "PRUNED", 6), ("0.003", 64, "COMPLETED", None), ("0.0003", 32, "COMPLETED", None),
          ("0.01", 32, "COMPLETED", None), ("0.05", 128, "RUNNING", None))


def loss_of(lr: str, batch: int) -> float:
    """The objective the trials' units report: lowest at lr = 0.01, a little lower with smaller batches."""
    return (math.log(float(lr)) + 4.6) ** 2 / 10 + batch / 1000


def _unit(xid: int, args: dict[str, str]) -> int:
    message = factories.work_unit_message(name="train")
    message.executable.jobset.jobs[0].spec.args.update(args)
    op = services.create_work_unit(xid, message, work_unit_id=0)
    return int(WorkUnit.objects.get(id=op.work_unit_id).wid)


def make_study(creator: str = ALICE, trials: tuple[tuple[str, int, str, int | None], ...] = TRIALS,
               publish: bool = False) -> Study:
    """An experiment with a template unit (wid 1) and a TPE study over lr and batch_size with ``trials``."""
    exp = factories.experiment(creator=creator, title="lr search")
    _unit(exp.id, {"lr": "0.01", "batch_size": "32", "epochs": "3"})
    study = study_services.create_study(exp.id, {
        "templateWorkUnit": 1, "parameters": {"lr": {"logUniform": [1e-4, 0.1]}, "batch_size": {"choice": [32, 64, 128]}},
        "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"}, "maxTrials": 12, "parallelTrials": 2,
        "sampler": "tpe", "pruner": {"median": {"warmupSteps": 5}}}, creator=creator)
    for number, (lr, batch, state, pruned_at) in enumerate(trials):
        wid = _unit(exp.id, {"lr": lr, "batch_size": str(batch), "epochs": "3"})
        value = loss_of(lr, batch) if state == "COMPLETED" else None
        if state != "RUNNING":
            _write(exp.id, wid, "loss", [2.0, 1.0, *([value] if value is not None else [])])
            pages.move(exp.id, wid, 1, "SCHEDULING", "STARTING", "RUNNING",
                       "COMPLETED" if state == "COMPLETED" else "STOPPED", publish=publish)
        Trial.objects.create(
            study=study, number=number, wid=wid, work_unit_id=None, state=state,
            parameters={"lr": float(lr), "batch_size": batch}, value=value, pruned_at_step=pruned_at,
            message=f"pruned by study {study.id} at step {pruned_at}: loss 1 above the median 0.5" if pruned_at else "",
            unit_done=state != "RUNNING", create_time=timezone.now())
    return study


def _rows(html: str) -> list[tuple[int, str]]:
    return [(int(n), s) for n, s in re.findall(r'<tr data-wid="\d+" data-number="(\d+)" data-state="(\w+)"', html)]


def _best_number() -> int:
    return min((n for n, t in enumerate(TRIALS) if t[2] == "COMPLETED"), key=lambda n: loss_of(TRIALS[n][0], TRIALS[n][1]))


def test_it_shows_every_trial_and_the_best_so_far_and_is_linked_from_the_experiment(alice_signed_in: Client) -> None:
    study = make_study()
    page = alice_signed_in.get(f"/experiments/{study.experiment_id}/studies/{study.id}").content.decode()
    assert _rows(page) == [(n, t[2]) for n, t in enumerate(TRIALS)]
    best = _best_number()
    assert re.search(rf'<tr data-wid="\d+" data-number="{best}" data-state="COMPLETED" class="best-row">', page)
    assert f"Best so far:</strong> trial {best} " in page
    assert "pruned by study" in page and "step 6" in page
    assert "8 of 12, 1 running (at most 2)" in page
    parallel = json.loads(html.unescape(re.search(r'data-parallel-json="([^"]*)"', page).group(1)))
    assert [a["name"] for a in parallel["axes"]] == ["lr", "batch_size", "loss"]
    assert len(parallel["units"]) == 7  # the finished trials, best first
    assert parallel["units"][0]["values"][2] == pytest.approx(loss_of(TRIALS[best][0], TRIALS[best][1]))

    experiment_page = alice_signed_in.get(f"/experiments/{study.experiment_id}").content.decode()
    assert f'href="/experiments/{study.experiment_id}/studies/{study.id}"' in experiment_page
    # Its progress there follows the study's own events (ui.live.publish_study), not only the experiment's.
    assert f'hx-trigger="sse:experiment, sse:study-{study.id}"' in experiment_page


def test_it_sorts_the_trials_table_by_a_parameter_or_the_objective_and_pages_it(alice_signed_in: Client) -> None:
    study = make_study()
    url = f"/experiments/{study.experiment_id}/studies/{study.id}"
    by_value = _rows(alice_signed_in.get(url, {"sort": "value"}).content.decode())
    completed = sorted((n for n, t in enumerate(TRIALS) if t[2] == "COMPLETED"),
                       key=lambda n: loss_of(TRIALS[n][0], TRIALS[n][1]))
    assert [n for n, _ in by_value] == completed + [3, 7]  # no value: last
    by_lr = _rows(alice_signed_in.get(url, {"sort": "param:lr", "dir": "desc"}).content.decode())
    assert [n for n, _ in by_lr] == sorted(range(8), key=lambda n: (-float(TRIALS[n][0]), -n))
    live = alice_signed_in.get(url, {"sort": "param:nope", "fragment": "live"}).content.decode()
    assert [n for n, _ in _rows(live)] == list(range(8)) and "<html" not in live  # unknown sort: by number


def test_it_pages_a_hundred_thousand_trials_in_the_database(alice_signed_in: Client, django_assert_max_num_queries: Any) -> None:
    study = make_study(trials=TRIALS[:1])
    with connection.cursor() as cursor:  # the controller's rows, 100,000 of them, written in one statement
        cursor.execute(
            "INSERT INTO studies_trial (study_id, number, wid, state, parameters, value, intermediate, system_attrs,"
            " message, unit_done, create_time) SELECT %s, n, 1000 + n, 'COMPLETED',"
            " jsonb_build_object('lr', n / 1e6, 'batch_size', 32), n %% 997, '{}', '{}', '', true, now()"
            " FROM generate_series(1, 100000) AS n", [study.id])
    url = f"/experiments/{study.experiment_id}/studies/{study.id}"
    with django_assert_max_num_queries(30):
        page = alice_signed_in.get(url, {"sort": "value", "dir": "desc", "page": "400", "size": "100"}).content.decode()
    rows = _rows(page)
    assert len(rows) == 100 and "39901–40000 of 100001 trials" in page
    history = json.loads(alice_signed_in.get(f"{url}/history", {"width": "300"}).content)
    assert len(history["plots"][0]["xs"]) <= 300


def test_it_gives_each_trial_and_the_best_so_far_as_the_history(alice_signed_in: Client) -> None:
    study = make_study()
    body = json.loads(alice_signed_in.get(f"/experiments/{study.experiment_id}/studies/{study.id}/history").content)
    (plot,) = body["plots"]
    completed = [n for n, t in enumerate(TRIALS) if t[2] == "COMPLETED"]
    assert plot["xs"] == completed
    values = [loss_of(TRIALS[n][0], TRIALS[n][1]) for n in completed]
    assert plot["series"][0]["y"] == pytest.approx(values)
    assert plot["series"][1]["y"] == pytest.approx([min(values[:i + 1]) for i in range(len(values))])


def test_it_computes_parameter_importance_over_the_study_trials_only(alice_signed_in: Client) -> None:
    study = make_study()
    xid = study.experiment_id
    answer = alice_signed_in.get(f"/experiments/{xid}/importance", {"metric": "loss", "goal": "MINIMIZE", "study": study.id})
    bars = dict(re.findall(r'<tr data-arg="([^"]+)" data-value="([0-9.]+)"', answer.content.decode()))
    assert set(bars) == {"lr", "batch_size"} and float(bars["lr"]) > float(bars["batch_size"])
    assert "over 6 completed trials" in answer.content.decode()  # the template unit has no loss, nor is it a trial


def test_it_does_not_find_someone_else_s_study(client: Client) -> None:
    study = make_study()
    bob = pages.signed_in("bob", client)
    assert bob.get(f"/experiments/{study.experiment_id}/studies/{study.id}").status_code == 404
    assert bob.get(f"/experiments/{study.experiment_id}/studies/{study.id}/history").status_code == 404
    alice_signed_in = pages.signed_in("alice", Client())
    assert alice_signed_in.get(f"/experiments/{study.experiment_id}/studies/{study.id + 1}").status_code == 404


def test_it_lets_a_writer_stop_the_study_from_its_page_and_not_a_reader(client: Client) -> None:
    study = make_study(trials=TRIALS[:2])
    url = f"/experiments/{study.experiment_id}/studies/{study.id}"
    exp = Experiment.objects.get(id=study.experiment_id)
    Experiment.objects.filter(id=exp.id).update(acls={**exp.acls, "readers": [{"user": "bob@example.com"}]})
    bob = pages.signed_in("bob", client)
    assert 'id="stop-study"' not in bob.get(url).content.decode()
    assert bob.post(f"{url}/stop").status_code == 403
    assert not Study.objects.get(id=study.id).stop_requested
    alice_signed_in = pages.signed_in("alice", Client())
    assert 'id="stop-study"' in alice_signed_in.get(url).content.decode()
    assert alice_signed_in.post(f"{url}/stop")["Location"] == url
    assert Study.objects.get(id=study.id).stop_requested
    assert 'id="study-stopping"' in alice_signed_in.get(url).content.decode()
