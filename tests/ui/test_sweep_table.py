"""The experiment page's work unit table: paged, sorted and filtered by the server over any number of units.

Django's test client on real Postgres; work units come from the real services. No silent cap: every
unit is on some page and the count of matching units is always printed; the job name, tags as chips,
inline edit of tags and notes through the API's UpdateWorkUnit, and exports of what the table shows.
"""
from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.test import Client

from tests import factories
from tests.ui import pages
from metrics import services as metric_services
from ui import present, reads
from workunits import services
from workunits.models import WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db

ALICE, BOB = "alice@example.com", "bob@example.com"
T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _wids(body: str) -> list[int]:
    return [int(w) for w in re.findall(r'<tr id="wu-(\d+)"', body)]


def _unit(xid: int, lr: str, *, name: str = "trainer", tags: tuple[str, ...] = ()) -> None:
    message = factories.work_unit_message(name=name)
    message.executable.jobset.jobs[0].spec.args["lr"] = lr
    message.tags.extend(tags)
    services.create_work_unit(xid, message, work_unit_id=0)


def test_it_pages_every_unit_and_always_says_how_many_match(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=ALICE, title="wide sweep")
    for i in range(120):
        _unit(exp.id, str(i), tags=("odd",) if i % 2 else ())
    first = alice_signed_in.get(f"/experiments/{exp.id}?size=50").content.decode()
    assert _wids(first) == list(range(1, 51))
    assert 'data-total="120"' in first and "1–50 of 120 work units" in first and "page 1 of 3" in first
    last = alice_signed_in.get(f"/experiments/{exp.id}?size=50&page=3").content.decode()
    assert _wids(last) == list(range(101, 121)) and "101–120 of 120" in last and 'rel="next"' not in last
    past = alice_signed_in.get(f"/experiments/{exp.id}?size=50&page=99").content.decode()
    assert _wids(past) == list(range(101, 121))  # past the end: the last page, not an empty one
    odd = alice_signed_in.get(f"/experiments/{exp.id}", {"filter": "tags:odd", "size": "50"}).content.decode()
    assert 'data-total="60"' in odd and "of 60 work units matching the filter" in odd
    assert _wids(odd) == list(range(2, 101, 2))
    assert not hasattr(reads, "MAX_UNITS")


def test_it_sorts_in_the_database_numbers_as_numbers(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=ALICE, title="lr")
    for lr in ("10", "9", "0.5", "1e-3"):
        _unit(exp.id, lr)
    body = alice_signed_in.get(f"/experiments/{exp.id}?sort=arg:lr").content.decode()
    assert _wids(body) == [4, 3, 2, 1]  # 0.001 < 0.5 < 9 < 10 (as text "10" < "1e-3" < "9")
    down = alice_signed_in.get(f"/experiments/{exp.id}?sort=arg:lr&dir=desc").content.decode()
    assert _wids(down) == [1, 2, 3, 4]
    assert 'href="?sort=arg%3Alr&amp;dir=asc" data-dir="desc">lr</a>' in down  # the header turns it around


def test_it_sorts_durations_by_their_length_not_their_text(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE, lrs=("0.1", "0.2", "0.3"))
    for wid, seconds in ((1, 65), (2, 9), (3, 3700)):  # 1m05s, 9s, 1h01m: by text "9s" would be last
        execution = WorkUnit.objects.get(experiment=exp, wid=wid).executions.get()
        ended = execution.create_time + timedelta(seconds=seconds)  # the write path stamps the end
        services.update_work_unit_executions(
            [ExecutionUpdate(xid=exp.id, wid=wid, eid=1, mask=("status.state",), state="COMPLETED",
                             state_update_time_ns=int(ended.timestamp() * 1e9))], now=ended)
    body = alice_signed_in.get(f"/experiments/{exp.id}?sort=duration").content.decode()
    assert _wids(body) == [2, 1, 3]
    assert 'data-value="9">9s</td>' in body and 'data-value="3700">1h01m</td>' in body


def test_it_shows_the_job_name_tags_as_chips_and_sorts_by_job(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=ALICE, title="jobs")
    _unit(exp.id, "1", name="succeeds", tags=("best", pages.HOSTILE))
    _unit(exp.id, "2", name="fails")
    body = alice_signed_in.get(f"/experiments/{exp.id}?sort=job").content.decode()
    assert _wids(body) == [2, 1]
    assert '<td class="job">succeeds</td>' in body and '<td class="job">fails</td>' in body
    assert '<span class="chip">best</span>' in body and "<script>alert(1)" not in body


def test_it_answers_a_bad_sort_or_filter_with_words_never_a_500(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    bad_sort = alice_signed_in.get(f"/experiments/{exp.id}?sort=arg:nope")
    assert bad_sort.status_code == 200 and "cannot sort by &#x27;arg:nope&#x27;" in bad_sort.content.decode()
    bad_filter = alice_signed_in.get(f"/experiments/{exp.id}", {"filter": "colour = red"})
    assert bad_filter.status_code == 200 and 'id="filter-error"' in bad_filter.content.decode()
    export = alice_signed_in.get(f"/experiments/{exp.id}", {"filter": "colour = red", "export": "csv"})
    assert export.status_code == 400 and b"filter" in export.content


def _export(client: Client, xid: int, kind: str, **params: str) -> Any:
    response = client.get(f"/experiments/{xid}", {**params, "export": kind})
    assert response.status_code == 200 and "attachment" in response["Content-Disposition"]
    return b"".join(response.streaming_content).decode()


def test_it_exports_exactly_the_rows_and_columns_of_the_table_as_csv_and_json(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE, lrs=("0.3", "0.1", "0.2", "0.4"))
    pages.move(exp.id, 2, 1, "SCHEDULING", "STARTING", "RUNNING")
    pages.move(exp.id, 3, 1, "SCHEDULING", "STARTING", "RUNNING")
    params = {"filter": "state = RUNNING OR wid = 1", "sort": "arg:lr"}
    table = alice_signed_in.get(f"/experiments/{exp.id}", params).content.decode()
    rows = list(csv.reader(io.StringIO(_export(alice_signed_in, exp.id, "csv", **params))))
    assert rows[0] == ["wid", "state", "exec", "job", "arg:lr", "tags", "notes", "why", "last_message", "started",
                       "duration_s"]
    assert [int(r[0]) for r in rows[1:]] == _wids(table) == [2, 3, 1]
    assert [r[4] for r in rows[1:]] == ["0.1", "0.2", "0.3"] and rows[1][1] == "RUNNING"
    data = json.loads(_export(alice_signed_in, exp.id, "json", **params))
    assert data["columns"] == rows[0] and [r["wid"] for r in data["rows"]] == [2, 3, 1]
    assert all(isinstance(r["duration_s"], int) for r in data["rows"])


def test_it_saves_tags_and_notes_inline_for_a_writer_only(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    form = alice_signed_in.get(f"/experiments/{exp.id}?fragment=edit&wid=2&col=lr").content.decode()
    assert form.startswith('<tr id="wu-2"') and 'name="tags"' in form and 'name="col" value="lr"' in form
    saved = alice_signed_in.post(f"/experiments/{exp.id}/workUnits/2/annotate",
                       {"tags": "best, lr-small\nrerun", "notes": "the one to keep", "col": "lr"})
    row = saved.content.decode()
    assert saved.status_code == 200 and row.startswith('<tr id="wu-2"') and '<td class="arg">0.01</td>' in row
    assert '<span class="chip">lr-small</span>' in row and "the one to keep" in row
    unit = WorkUnit.objects.get(experiment=exp, wid=2)
    assert unit.tags == ["best", "lr-small", "rerun"] and unit.notes == "the one to keep"
    refused = alice_signed_in.post(f"/experiments/{exp.id}/workUnits/2/annotate", {"tags": "x" * 300, "notes": "kept?"})
    assert refused.status_code == 422 and "tags" in refused.content.decode() and 'name="notes"' in refused.content.decode()
    assert WorkUnit.objects.get(experiment=exp, wid=2).notes == "the one to keep"  # nothing written

    shared, _ = pages.sweep(BOB, acls=pages.shared_with(ALICE))
    assert "Edit</button>" not in alice_signed_in.get(f"/experiments/{shared.id}").content.decode()
    assert alice_signed_in.get(f"/experiments/{shared.id}?fragment=edit&wid=1").status_code == 403
    assert alice_signed_in.post(f"/experiments/{shared.id}/workUnits/1/annotate", {"tags": "mine"}).status_code == 403
    assert WorkUnit.objects.get(experiment=shared, wid=1).tags == []
    stranger = pages.signed_in("carol")
    assert stranger.post(f"/experiments/{exp.id}/workUnits/2/annotate", {"tags": "x"}).status_code == 404


def test_it_finds_the_sweeps_columns_in_the_database_as_from_the_rows() -> None:
    exp = factories.experiment(creator=ALICE)
    for lr, extra in (("0.1", {"seed": "1"}), ("0.2", {"seed": "1"}), ("0.2", {})):
        message = factories.work_unit_message()
        message.executable.jobset.jobs[0].spec.args.update({"lr": lr, "batch": "64", **extra})
        message.executable.jobset.jobs[0].spec.args_list.extend(["--fast"])
        services.create_work_unit(exp.id, message, work_unit_id=0)
    expected_rows = [present.job_args(u.executable) for u in WorkUnit.objects.filter(experiment=exp)]
    assert reads.sweep_args(exp.id) == present.sweep(expected_rows)
    assert reads.sweep_args(exp.id) == (["lr", "seed"], {"argv[0]": "--fast", "batch": "64"})


def test_it_keeps_the_sweeps_columns_right_as_units_are_added() -> None:
    exp = factories.experiment(creator=ALICE)
    _unit(exp.id, "0.1")
    _unit(exp.id, "0.1")
    assert reads.sweep_args(exp.id) == ([], {"lr": "0.1"})
    _unit(exp.id, "0.2")  # read on top of what the process kept
    assert reads.sweep_args(exp.id) == (["lr"], {})
    services.create_work_unit(exp.id, factories.work_unit_message(), work_unit_id=0)  # a unit without lr
    assert reads.sweep_args(exp.id) == (["lr"], {})


def _write(xid: int, wid: int, metric: str, values: list[float]) -> None:
    execution = WorkUnitExecution.objects.get(work_unit__experiment_id=xid, work_unit__wid=wid, eid=1).pk
    metric_services.write_points(execution, [metric_services.Point(metric, step, value, T0 + timedelta(seconds=step))
                                             for step, value in enumerate(values)])


def _metric_sweep() -> Any:
    exp = factories.experiment(creator=ALICE, title="lr with metrics")
    for wid, (lr, loss, accuracy) in enumerate((("0.1", 0.9, 0.6), ("0.01", 0.2, 0.9), ("0.001", 0.5, 0.7)), 1):
        _unit(exp.id, lr)
        _write(exp.id, wid, "loss", [2.0, loss])
        _write(exp.id, wid, "accuracy", [0.1, accuracy])
        _write(exp.id, wid, "val_error", [0.3])
    return exp


def test_it_shows_metric_columns_marks_the_best_and_sorts_by_a_metric(alice_signed_in: Client) -> None:
    exp = _metric_sweep()
    body = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()  # the experiment's first three metrics
    for metric in ("accuracy", "loss", "val_error"):
        assert f'sort=metric%3A{metric}" data-dir="">{metric}</a>' in body
    assert '<td class="num metric best" title="best" data-metric="loss" data-value="0.2">0.2</td>' in body
    assert '<td class="num metric best" title="best" data-metric="accuracy" data-value="0.9">0.9</td>' in body
    by_loss = alice_signed_in.get(f"/experiments/{exp.id}", {"m": "loss", "sort": "metric:loss"}).content.decode()
    assert _wids(by_loss) == [2, 3, 1] and "accuracy</a>" not in by_loss  # the columns the URL names
    assert "m=loss" in by_loss.split('id="export-csv"')[1].split(">")[0]  # kept in the links
    flipped = alice_signed_in.get(f"/experiments/{exp.id}", {"m": "loss", "goal": "loss:max"}).content.decode()
    assert '<td class="num metric best" title="best" data-metric="loss" data-value="0.9">0.9</td>' in flipped
    filtered = alice_signed_in.get(f"/experiments/{exp.id}", {"m": "loss", "filter": "args.lr = 0.001"}).content.decode()
    assert _wids(filtered) == [3] and 'title="best" data-metric="loss" data-value="0.5"' in filtered  # the best of what matches
    by_metric = alice_signed_in.get(f"/experiments/{exp.id}", {"m": "loss", "filter": "metrics.loss.last < 0.6"}).content.decode()
    assert _wids(by_metric) == [2, 3]
    unknown = alice_signed_in.get(f"/experiments/{exp.id}", {"m": "nope"}).content.decode()
    assert 'id="filter-error"' in unknown and "no metric &#x27;nope&#x27;" in unknown
    rows = list(csv.reader(io.StringIO(_export(alice_signed_in, exp.id, "csv", m="loss", sort="metric:loss"))))
    assert rows[0][4:6] == ["arg:lr", "metric:loss"] and [r[5] for r in rows[1:]] == ["0.2", "0.5", "0.9"]


def test_it_shows_a_metric_named_by_a_path_as_a_column_that_sorts_and_filters(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=ALICE, title="paths")
    for wid, (lr, loss, gpu) in enumerate((("0.1", 0.9, 40.0), ("0.01", 0.2, 95.0), ("0.001", 0.5, 70.0)), 1):
        _unit(exp.id, lr)
        _write(exp.id, wid, "train/loss", [2.0, loss])
        _write(exp.id, wid, "system/gpu_utilization", [gpu])
    body = alice_signed_in.get(f"/experiments/{exp.id}", {"m": ["train/loss", "system/gpu_utilization"],
                                                "sort": "metric:train/loss"}).content.decode()
    assert _wids(body) == [2, 3, 1]
    assert 'sort=metric%3Atrain%2Floss' in body and ">system/gpu_utilization</a>" in body
    assert '<td class="num metric best" title="best" data-metric="train/loss" data-value="0.2">0.2</td>' in body
    filtered = alice_signed_in.get(f"/experiments/{exp.id}", {"m": "train/loss", "sort": "metric:train/loss", "dir": "desc",
                                                    "filter": "metrics.system/gpu_utilization.max >= 70"}).content.decode()
    assert _wids(filtered) == [3, 2] and 'id="filter-error"' not in filtered
    rows = list(csv.reader(io.StringIO(_export(alice_signed_in, exp.id, "csv", m="train/loss", sort="metric:train/loss"))))
    assert "metric:train/loss" in rows[0] and [r[rows[0].index("metric:train/loss")] for r in rows[1:]] == [
        "0.2", "0.5", "0.9"]


def test_it_redraws_a_row_with_its_metric_columns_and_best_mark(alice_signed_in: Client) -> None:
    exp = _metric_sweep()
    page = alice_signed_in.get(f"/experiments/{exp.id}", {"m": "loss"}).content.decode()
    url = re.search(r'<tr id="wu-2"[^>]* hx-get="([^"]+)"', page).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
    assert "m=loss" in url and "b=loss%3A0.2" in url
    row = alice_signed_in.get(url).content.decode()
    assert row.startswith('<tr id="wu-2"') and 'title="best" data-metric="loss" data-value="0.2">0.2</td>' in row


def test_it_defaults_the_metric_columns_to_the_jobs_own_not_the_system_metrics(alice_signed_in: Client) -> None:
    from metrics import services as metric_services
    from metrics.services import Point
    from workunits.models import WorkUnitExecution
    from django.utils import timezone

    exp = factories.experiment(creator=ALICE, title="own metrics first")
    _unit(exp.id, "0.1")
    execution = WorkUnitExecution.objects.get(work_unit__experiment=exp)
    now = timezone.now()
    metric_services.write_points(execution.id, [Point("accuracy", 1, 0.9, now), Point("system/cpu_usage_cores", 1, 2.0, now),
                                                Point("val_loss", 1, 0.3, now)])
    body = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert 'value="val_loss" checked' in body and 'value="accuracy" checked' in body
    # Pickable, not a default column: the unit page's System group shows it.
    assert 'value="system/cpu_usage_cores">' in body and 'value="system/cpu_usage_cores" checked' not in body
