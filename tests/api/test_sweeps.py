"""The sweep read: ``GET /v1/experiments/{xid}/workUnits:summarize`` and the ``args.<name>`` /
``metrics.<name>.<stat>`` fields it shares with ListWorkUnits.

Alice sweeps ``lr`` x ``batch_size`` (eight units that also share ``epochs=10``); each unit writes a
``loss`` that depends on its arguments and an ``accuracy``; Bob may not read her experiment.
"""
from __future__ import annotations

import importlib
import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlencode

import pytest
from django.apps import apps
from django.test import Client

from core import pb
from metrics import services as metric_services
from tests import factories
from workunits import arguments
from workunits import services as wu_services
from workunits.models import WorkUnit, WorkUnitExecution
from xmc.auth.tokens import issue_token

ALICE, BOB = factories.ALICE, factories.BOB
T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
LRS = ("0.001", "0.01", "0.1", "1e-4")
BATCHES = ("16", "128")

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_rate_limit(settings: Any) -> None:
    settings.XMC_RATE_LIMIT_PER_S = 0


def _unit(exp: Any, wid: int, args: dict[str, str], *, job: str = "trainer") -> WorkUnit:
    message = factories.work_unit_message(name=job)
    message.executable.jobset.jobs[0].spec.args.update(args)
    op = wu_services.create_work_unit(exp.id, message, work_unit_id=wid)
    return WorkUnit.objects.get(id=op.work_unit_id)


def _write(unit: WorkUnit, metric: str, values: list[float], eid: int = 1) -> None:
    execution = WorkUnitExecution.objects.get(work_unit=unit, eid=eid).pk
    metric_services.write_points(execution, [metric_services.Point(metric, step, value, T0 + timedelta(seconds=step))
                                             for step, value in enumerate(values)])


def loss_of(lr: str, batch: str) -> float:
    return (math.log(float(lr)) + 4.6) ** 2 / 10 + int(batch) / 1000


@pytest.fixture
def sweep() -> Any:
    exp = factories.experiment(ALICE, title="lr x batch")
    wid = 0
    for lr in LRS:
        for batch in BATCHES:
            wid += 1
            unit = _unit(exp, wid, {"lr": lr, "batch_size": batch, "epochs": "10"})
            final = loss_of(lr, batch)
            _write(unit, "loss", [final + 1.0, final + 0.5, final])
            _write(unit, "accuracy", [0.5, 1 - final / 10])
    return exp


def _get(path: str, who: str = ALICE, **params: Any) -> tuple[int, Any]:
    url = path + ("?" + urlencode(params) if params else "")
    answer = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {issue_token(who)}")
    return answer.status_code, json.loads(answer.content)


def summarize(exp: Any, who: str = ALICE, **params: Any) -> tuple[int, Any]:
    return _get(f"/v1/experiments/{exp.id}/workUnits:summarize", who, **params)


def test_it_answers_each_unit_with_its_args_and_metric_summaries(sweep: Any) -> None:
    status, body = summarize(sweep)
    assert status == 200, body
    assert body["metrics"] == ["accuracy", "loss"]
    assert body["argsInCommon"] == {"epochs": "10"} and body["varyingArgs"] == ["batch_size", "lr"]
    assert body["totalSize"] == 8 and body["nextPageToken"] == ""
    assert [row["workUnitId"] for row in body["workUnits"]] == list(range(1, 9))
    first = body["workUnits"][0]
    final = loss_of("0.001", "16")
    assert first == {
        "workUnitId": 1, "jobName": "trainer", "state": "INITIALIZING", "tags": [], "notes": "",
        "args": {"lr": "0.001", "batch_size": "16", "epochs": "10"},
        "metrics": {"loss": {"last": pytest.approx(final), "lastStep": 2, "min": pytest.approx(final),
                             "max": pytest.approx(final + 1.0), "count": 3},
                    "accuracy": {"last": pytest.approx(1 - final / 10), "lastStep": 1,
                                 "min": pytest.approx(min(0.5, 1 - final / 10)),
                                 "max": pytest.approx(max(0.5, 1 - final / 10)), "count": 2}},
    }
    status, body = summarize(sweep, metrics="loss")
    assert body["metrics"] == ["loss"] and set(body["workUnits"][0]["metrics"]) == {"loss"}


def test_it_puts_the_best_unit_first_across_pages_when_ordering_by_a_metric(sweep: Any) -> None:
    quiet = _unit(sweep, 9, {"lr": "0.5", "batch_size": "16", "epochs": "10"})  # no metrics: sorts last
    expected = sorted(((loss_of(lr, b), i * 2 + j + 1) for i, lr in enumerate(LRS) for j, b in enumerate(BATCHES)))
    seen: list[int] = []
    token = ""
    while True:
        status, body = summarize(sweep, orderBy="metrics.loss.last", pageSize=3, pageToken=token)
        assert status == 200, body
        seen += [row["workUnitId"] for row in body["workUnits"]]
        token = body["nextPageToken"]
        if not token:
            break
    assert seen == [wid for _, wid in expected] + [quiet.wid]
    status, body = summarize(sweep, orderBy="metrics.loss.last desc", pageSize=2)
    assert [row["workUnitId"] for row in body["workUnits"]] == [quiet.wid, expected[-1][1]]
    assert body["totalSize"] == 9


def test_it_orders_by_an_argument_numerically_when_every_value_is_a_number(sweep: Any) -> None:
    status, body = summarize(sweep, orderBy="args.lr desc, args.batch_size", metrics="loss")
    lrs = [(row["args"]["lr"], row["args"]["batch_size"]) for row in body["workUnits"]]
    assert lrs == sorted(lrs, key=lambda p: (-float(p[0]), int(p[1])))
    _unit(sweep, 20, {"lr": "warmup", "batch_size": "16", "epochs": "10"})  # now lr is text: it sorts as text
    status, body = summarize(sweep, orderBy="args.lr")
    assert [row["args"]["lr"] for row in body["workUnits"]] == sorted([*[lr for lr in LRS for _ in BATCHES], "warmup"])


@pytest.mark.parametrize(("text", "wids"), [
    ("args.lr = 0.01", [3, 4]),
    ("args.lr = 1e-2", [3, 4]),  # numbers on both sides: compared as numbers
    ("args.lr < 0.01", [1, 2, 7, 8]),
    ("args.lr >= 0.01 AND args.batch_size = 128", [4, 6]),
    ("args.lr = \"1e-4\"", [7, 8]),
    ("args.epochs != 10", []),
    ("args.lr:*", [1, 2, 3, 4, 5, 6, 7, 8]),
    ("metrics.loss.last < 0.2", None),
    ("metrics.accuracy.max > 0.9 AND args.batch_size = 16", None),
    ("metrics.loss.min >= 0 state = INITIALIZING", [1, 2, 3, 4, 5, 6, 7, 8]),
])
def test_it_filters_by_arguments_and_metrics_in_the_database(sweep: Any, text: str, wids: list[int] | None) -> None:
    if wids is None:  # computed from the losses the units wrote
        rows = [(i * 2 + j + 1, loss_of(lr, b), b) for i, lr in enumerate(LRS) for j, b in enumerate(BATCHES)]
        if text.startswith("metrics.loss"):
            wids = [wid for wid, loss, _ in rows if loss < 0.2]
        else:
            wids = [wid for wid, loss, b in rows if max(0.5, 1 - loss / 10) > 0.9 and b == "16"]
        assert 0 < len(wids) < 8
    status, body = summarize(sweep, filter=text)
    assert status == 200, body
    assert [row["workUnitId"] for row in body["workUnits"]] == wids
    assert body["totalSize"] == len(wids)


def test_it_compares_an_argument_that_is_text_as_text(sweep: Any) -> None:
    _unit(sweep, 30, {"lr": "0.01", "optimizer": "adam"})
    _unit(sweep, 31, {"lr": "0.010", "optimizer": "sgd"})
    assert [r["workUnitId"] for r in summarize(sweep, filter="args.optimizer = adam")[1]["workUnits"]] == [30]
    assert [r["workUnitId"] for r in summarize(sweep, filter="args.optimizer > b")[1]["workUnits"]] == [31]
    # Numbers on both sides: "0.010" equals 0.01.
    assert [r["workUnitId"] for r in summarize(sweep, filter="args.lr = 0.01 args.optimizer:*")[1]["workUnits"]] == [30, 31]


def test_it_takes_the_same_fields_in_list_work_units(sweep: Any) -> None:
    status, body = _get(f"/v1/experiments/{sweep.id}/workUnits", filter="args.lr = 0.1",
                        orderBy="metrics.loss.last desc")
    assert status == 200, body
    names = [unit["name"] for unit in body["workUnits"]]
    assert names == [f"experiments/{sweep.id}/workUnits/6", f"experiments/{sweep.id}/workUnits/5"]


def test_it_makes_a_units_summary_its_current_executions(sweep: Any) -> None:
    wu_services.restart_work_units(sweep.id, [1], batch=False)
    status, body = summarize(sweep, filter="wid = 1")
    assert body["workUnits"][0]["metrics"] == {}  # execution 2 has written nothing yet
    _write(WorkUnit.objects.get(experiment=sweep, wid=1), "loss", [9.0], eid=2)
    status, body = summarize(sweep, filter="metrics.loss.last = 9")
    assert [r["workUnitId"] for r in body["workUnits"]] == [1]
    assert body["workUnits"][0]["metrics"]["loss"] == {"last": 9.0, "lastStep": 0, "min": 9.0, "max": 9.0, "count": 1}


@pytest.mark.parametrize(("params", "field", "words"), [
    ({"filter": "args.nope = 1"}, "filter", "'args.nope'"),
    ({"filter": "metrics.nope.last < 1"}, "filter", "'metrics.nope.last'"),
    ({"filter": "metrics.loss.median < 1"}, "filter", "'metrics.loss.median'"),
    ({"filter": "metrics.loss.last < low"}, "filter", "'metrics.loss.last'"),
    ({"filter": "colour = red"}, "filter", "args.<name>"),
    ({"orderBy": "metrics.nope.last"}, "orderBy", "'metrics.nope.last'"),
    ({"orderBy": "args.nope desc"}, "orderBy", "'args.nope'"),
    ({"orderBy": "loss"}, "orderBy", "'loss'"),
    ({"metrics": "loss,nope"}, "metrics", "'nope'"),
    ({"pageToken": "garbage"}, "pageToken", "page_token"),
    ({"pageSize": "-1"}, "pageSize", "page_size"),
    ({"pageSize": "ten"}, "pageSize", "'ten'"),
])
def test_it_answers_invalid_argument_naming_the_field_for_unknown_names_and_bad_values(
        sweep: Any, params: dict[str, str], field: str, words: str) -> None:
    status, body = summarize(sweep, **params)
    assert status == 400, body
    assert body["error"]["status"] == "INVALID_ARGUMENT" and words in body["error"]["message"]
    assert field in json.dumps(body)
    if field in ("filter", "orderBy"):  # the same on ListWorkUnits
        status, body = _get(f"/v1/experiments/{sweep.id}/workUnits", **params)
        assert status == 400 and words in body["error"]["message"], body


def test_it_refuses_a_stranger_before_anything_else(sweep: Any) -> None:
    for params in ({}, {"filter": "args.nope = 1"}, {"metrics": "nope"}):
        status, body = summarize(sweep, BOB, **params)
        assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
    assert Client().get(f"/v1/experiments/{sweep.id}/workUnits:summarize").status_code == 401


def test_it_is_in_the_openapi_document() -> None:
    document = json.loads(Client().get("/v1/openapi.json").content)
    assert "get" in document["paths"]["/v1/experiments/{xid}/workUnits:summarize"]


def test_it_names_jobs_after_the_xmanager_job_or_group() -> None:
    exp = factories.experiment(ALICE)
    message = factories.work_unit_message(name="server")
    message.executable.jobset.jobs.append(pb.work_unit.KubernetesJob(name="client", replicas=1, spec=message.executable.jobset.jobs[0].spec))
    wu_services.create_work_unit(exp.id, message, work_unit_id=1)
    message = factories.work_unit_message(name="a", group_name="pair")
    message.executable.jobset.jobs.append(pb.work_unit.KubernetesJob(name="b", group_name="pair", replicas=1,
                                                                     spec=message.executable.jobset.jobs[0].spec))
    wu_services.create_work_unit(exp.id, message, work_unit_id=2)
    status, body = summarize(exp)
    assert [row["jobName"] for row in body["workUnits"]] == ["server+client", "pair"]


def test_it_has_the_migration_fill_the_args_of_units_created_before_it(sweep: Any) -> None:
    migration: Any = importlib.import_module("workunits.migrations.0007_work_unit_args")
    WorkUnit.objects.filter(experiment=sweep).update(args={})
    migration.fill_args(apps, None)
    assert dict(WorkUnit.objects.filter(experiment=sweep, wid=3).values_list("wid", "args")) == {
        3: {"lr": "0.01", "batch_size": "16", "epochs": "10"}}


def test_it_counts_only_finite_decimal_numbers_as_numbers() -> None:
    args = {"a": "0.01", "b": "-3", "c": ".5", "d": "1e-4", "e": "nan", "f": "inf", "g": "1_000", "h": "0x10",
            "i": "1e999", "j": "", "k": "12abc"}
    assert arguments.numbers(args) == {"a": 0.01, "b": -3.0, "c": 0.5, "d": 1e-4}


def test_it_compares_an_argument_that_is_not_a_number_as_text_with_a_number_literal(sweep: Any) -> None:
    _unit(sweep, 40, {"lr": "nan"})
    _unit(sweep, 41, {"lr": "1_000"})
    # No numeric lr of the sweep is above 0.5; "nan" and "1_000" are text, and as text both sort after "0.5".
    assert [r["workUnitId"] for r in summarize(sweep, filter="args.lr > 0.5")[1]["workUnits"]] == [40, 41]
    assert [r["workUnitId"] for r in summarize(sweep, filter="args.lr < 0.5 args.lr > 0.05")[1]["workUnits"]] == [5, 6]


def test_it_filters_and_orders_by_metric_names_with_a_slash_as_any_other(sweep: Any) -> None:
    # Trackers name metrics by path (``train/loss``); system metrics are ``system/gpu_utilization``.
    units = list(WorkUnit.objects.filter(experiment=sweep).order_by("wid"))
    for n, unit in enumerate(units):
        _write(unit, "train/loss", [10.0 - n])
        _write(unit, "system/gpu_utilization", [float(n * 10)])
    code, page = summarize(sweep, metrics="train/loss,system/gpu_utilization",
                           filter="metrics.system/gpu_utilization.max >= 30", orderBy="metrics.train/loss.last")
    assert code == 200, page
    assert [row["workUnitId"] for row in page["workUnits"]] == [8, 7, 6, 5, 4]
    assert page["workUnits"][0]["metrics"]["train/loss"]["last"] == 3.0
    code, page = summarize(sweep, filter='metrics."train/loss".min < 5', orderBy='metrics."train/loss".last desc')
    assert code == 200, page
    assert [row["workUnitId"] for row in page["workUnits"]] == [7, 8]
    code, page = summarize(sweep, orderBy="metrics.train/lost.last")
    assert code == 400 and "train/lost" in json.dumps(page)
