"""The compare view through Django's test client: the overlay's data, grouping, smoothing, the diff.

Real Postgres; metrics through the real write path (``metrics.services.write_points``), so the
overlay is GetChartData's evaluation over exactly the selected units.
"""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from tests.ui import pages
from tests import factories
from tests.ui.test_sweep_table import _write
from ui import compare
from workunits import services

pytestmark = pytest.mark.django_db

ALICE = "alice@example.com"


def _sweep() -> Any:
    exp = factories.experiment(creator=ALICE, title="compare me")
    for wid, (lr, batch) in enumerate((("0.1", "32"), ("0.1", "64"), ("0.01", "32"), ("0.01", "64")), 1):
        message = factories.work_unit_message(name="train")
        message.executable.jobset.jobs[0].spec.args.update({"lr": lr, "batch": batch})
        if wid == 2:
            message.executable.jobset.jobs[0].spec.env_vars["SEED"] = "7"
        message.tags.append(f"t{wid}")
        services.create_work_unit(exp.id, message, work_unit_id=0)
        _write(exp.id, wid, "loss", [4.0 / wid, 2.0 / wid, 1.0 / wid])
    return exp


def _data(client: Client, xid: int, **params: Any) -> Any:
    response = client.get(f"/experiments/{xid}/compare/data", params)
    assert response.status_code == 200, response.content[:300]
    return json.loads(response.content)


def test_it_overlays_one_line_per_selected_unit_only(alice_signed_in: Client) -> None:
    exp = _sweep()
    body = _data(alice_signed_in, exp.id, wid=["1", "3"], metric="loss")
    (plot,) = body["plots"]
    assert [s["label"] for s in plot["series"]] == ["wu 1 · train", "wu 3 · train"]
    assert plot["series"][1]["y"] == pytest.approx([4 / 3, 2 / 3, 1 / 3])
    every = _data(alice_signed_in, exp.id, all="1", filter="args.lr = 0.01", metric="loss")
    assert [s["wid"] for s in every["plots"][0]["series"]] == [3, 4]


def test_it_groups_by_an_argument_with_a_min_max_band_and_smooths(alice_signed_in: Client) -> None:
    exp = _sweep()
    body = _data(alice_signed_in, exp.id, wid=["1", "2", "3", "4"], metric="loss", group="lr")
    by_lr = {s["label"]: s for s in body["plots"][0]["series"]}
    high = by_lr["lr=0.1 (mean of 2)"]  # units 1 and 2: 4/1 and 4/2 at step 0
    assert high["y"][0] == pytest.approx(3.0) and (high["lo"][0], high["hi"][0]) == (2.0, 4.0)
    smooth = _data(alice_signed_in, exp.id, wid=["1"], metric="loss", smooth="0.5")["plots"][0]["series"][0]["y"]
    assert smooth == pytest.approx([4.0, 3.0, 2.0])  # s = 0.5 x + 0.5 s_prev


def test_it_diffs_two_units_and_marks_what_differs(alice_signed_in: Client) -> None:
    exp = _sweep()
    body = alice_signed_in.get(f"/experiments/{exp.id}/compare", {"wid": ["1", "2"]}).content.decode()
    assert '<tr class="differs" data-section="args" data-name="batch">' in body
    assert '<tr class="" data-section="args" data-name="lr">' in body
    assert '<tr class="differs" data-section="env" data-name="SEED">' in body
    assert '<tr class="differs" data-section="job" data-name="tags">' in body
    assert '<tr class="differs" data-section="metrics" data-name="loss.last">' in body
    assert 'id="parallel-data"' in body and 'id="overlay"' in body


def test_it_says_when_more_units_match_than_it_compares(alice_signed_in: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    exp = _sweep()
    monkeypatch.setattr(compare, "MAX_COMPARE", 3)
    body = alice_signed_in.get(f"/experiments/{exp.id}/compare", {"all": "1"}).content.decode()
    assert "The first 3 of 4 selected or matching units" in body
    stranger = pages.signed_in("carol")
    assert stranger.get(f"/experiments/{exp.id}/compare", {"wid": "1"}).status_code == 404
    assert stranger.get(f"/experiments/{exp.id}/compare/data", {"wid": "1", "metric": "loss"}).status_code == 404
    assert alice_signed_in.get(f"/experiments/{exp.id}/compare/data", {"wid": "1", "metric": ""}).status_code == 400



def test_it_shows_parameter_importance_as_bars_when_opened(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=ALICE, title="importance")
    for wid, (lr, batch) in enumerate(((lr, b) for lr in ("0.1", "0.01", "0.001") for b in ("32", "64")), 1):
        message = factories.work_unit_message(name="train")
        message.executable.jobset.jobs[0].spec.args.update({"lr": lr, "batch": batch})
        services.create_work_unit(exp.id, message, work_unit_id=0)
        _write(exp.id, wid, "loss", [5.0, float(lr) * 100 + int(batch) / 1000])
        pages.move(exp.id, wid, 1, "SCHEDULING", "STARTING", "RUNNING", "COMPLETED")
    page = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert f'hx-get="/experiments/{exp.id}/importance?metric=loss&amp;goal=MINIMIZE"' in page
    bars = alice_signed_in.get(f"/experiments/{exp.id}/importance", {"metric": "loss", "goal": "MINIMIZE"}).content.decode()
    found = dict(re.findall(r'data-arg="([^"]+)" data-value="([0-9.]+)"', bars))
    assert set(found) == {"lr", "batch"} and float(found["lr"]) > float(found["batch"])
    assert bars.index('data-arg="lr"') < bars.index('data-arg="batch"') and "<meter" in bars
    few = alice_signed_in.get(f"/experiments/{exp.id}/importance", {"metric": "nope"}).content.decode()
    assert 'id="importance-error"' in few and "nope" in few
