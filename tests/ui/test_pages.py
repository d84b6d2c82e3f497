"""The researcher's pages through Django's test client: who sees what, sweeps, actions, hostile values.

Real Postgres, real services; the sign-in is the site's session login.
"""
from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest
from django.test import Client

from core import pb
from tests import factories
from tests.ui import pages
from workunits.models import WorkUnitExecution

pytestmark = pytest.mark.django_db

ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"


def _as(name: str) -> Client:
    return pages.signed_in(name)


def test_it_sends_a_stranger_to_the_sign_in_page(client: Client) -> None:
    response = client.get("/experiments/1")
    assert response.status_code == 302 and response["Location"] == "/login?next=%2Fexperiments%2F1"
    page = client.get("/login")
    assert page.status_code == 200 and b'name="password"' in page.content
    assert "script-src 'self'" in page["Content-Security-Policy"]


def test_it_signs_in_with_the_site_login_and_lists_only_readable_experiments(client: Client) -> None:
    pages.person("alice")
    response = client.post("/login", {"username": "alice", "password": pages.PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/experiments"
    mine = factories.experiment(creator=ALICE, title="mine")
    shared = factories.experiment(creator=BOB, title="shared one", acls=pages.shared_with(ALICE))
    hidden = factories.experiment(creator=BOB, title="bobs secret")
    body = client.get("/experiments").content.decode()
    assert f'href="/experiments/{mine.id}"' in body and "shared one" in body
    assert "bobs secret" not in body and f'/experiments/{hidden.id}"' not in body
    mine_only = client.get("/experiments?mine=1").content.decode()
    assert "shared one" not in mine_only and "mine" in mine_only


def test_it_filters_by_title_state_and_the_apis_filter_syntax(alice_signed_in: Client) -> None:
    factories.experiment(creator=ALICE, title="resnet baseline", tags=["vision"])
    factories.experiment(creator=ALICE, title="bert large", tags=["nlp"])
    assert "bert large" not in alice_signed_in.get("/experiments?q=resnet").content.decode()
    body = alice_signed_in.get('/experiments?filter=tags:"nlp"').content.decode()
    assert "bert large" in body and "resnet baseline" not in body
    bad = alice_signed_in.get("/experiments?filter=title %3D%3D").content.decode()
    assert 'id="filter-error"' in bad


def test_it_pages_the_list_with_the_apis_page_tokens(alice_signed_in: Client) -> None:
    for i in range(55):
        factories.experiment(creator=ALICE, title=f"run {i:02d}")
    first = alice_signed_in.get("/experiments?order=title").content.decode()
    assert "run 00" in first and "run 54" not in first and 'rel="next"' in first
    next_url = first.split('rel="next"')[0].rsplit('href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    second = alice_signed_in.get(f"/experiments{next_url}").content.decode()
    assert "run 54" in second and "run 00" not in second


def test_it_shows_a_sweep_as_columns_and_shared_args_in_a_header_line(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    body = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert 'sort=arg%3Alr" data-dir="">lr</a></th>' in body
    assert ">batch</a></th>" not in body and "<code>batch=64</code>" in body
    for lr in ("0.1", "0.01", "0.001"):
        assert f'<td class="arg">{lr}</td>' in body


def test_it_answers_404_for_someone_elses_experiment_and_a_missing_work_unit(alice_signed_in: Client) -> None:
    exp = factories.experiment(creator=BOB, title="private")
    factories.work_unit(exp)
    for path in (f"/experiments/{exp.id}", f"/experiments/{exp.id}/workUnits/1", "/experiments/999999",
                 f"/experiments/{exp.id}/workUnits/1/logs"):
        response = alice_signed_in.get(path)
        assert response.status_code == 404, path
        assert b"private" not in response.content
    mine = factories.experiment(creator=ALICE)
    assert alice_signed_in.get(f"/experiments/{mine.id}/workUnits/7").status_code == 404
    assert alice_signed_in.get(f"/experiments/{mine.id}/workUnits/99999999999999999999").status_code == 404
    assert alice_signed_in.post(f"/experiments/{exp.id}/actions", {"action": "stop", "wid": "1", "confirm": "yes"}
                      ).status_code == 404
    assert WorkUnitExecution.objects.get(work_unit__experiment=exp).state == "INITIALIZING"


def test_it_reads_every_route_s_ids_with_the_one_converter_and_answers_404_past_the_largest(alice_signed_in: Client) -> None:
    """Ids are spelled once (core.names.IdConverter): an id the database cannot hold never reaches a view."""
    import re

    from django.urls.resolvers import RoutePattern

    from core.limits import MAX_ID
    from ui import urls

    routes = [str(p.pattern) for p in urls.urlpatterns]
    assert all(isinstance(p.pattern, RoutePattern) for p in urls.urlpatterns), routes  # no regex of its own
    with_ids = [r for r in routes if "<id:" in r]
    assert len(with_ids) >= 20, with_ids
    for route in with_ids:
        for too_big in (str(MAX_ID + 1), "9" * 20):
            path = "/" + re.sub(r"<slug_id:\w+>", "c1", re.sub(r"<id:\w+>", too_big, route))
            assert alice_signed_in.get(path).status_code == 404, path
            assert alice_signed_in.post(path).status_code == 404, path


def test_it_offers_no_actions_on_a_read_only_experiment_and_refuses_them(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(BOB, acls=pages.shared_with(ALICE))
    body = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert 'id="bulk"' not in body and "Stop…" not in body and 'id="compare-selected"' in body  # selects to compare
    unit = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1").content.decode()
    assert 'id="unit-actions"' not in unit and "Stop…" not in unit
    refused = alice_signed_in.post(f"/experiments/{exp.id}/actions", {"action": "stop", "wid": "1", "confirm": "yes"})
    assert refused.status_code == 403
    assert WorkUnitExecution.objects.get(work_unit__experiment=exp, work_unit__wid=1).state == "INITIALIZING"


def test_it_stops_and_restarts_selected_units_after_a_confirmation(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    pages.move(exp.id, 3, 1, "SCHEDULING", "STARTING", "RUNNING", "COMPLETED")
    confirm = alice_signed_in.post(f"/experiments/{exp.id}/actions", {"action": "stop", "wid": ["1", "3"]})
    assert confirm.status_code == 200 and b'name="confirm" value="yes"' in confirm.content
    assert WorkUnitExecution.objects.get(work_unit__experiment=exp, work_unit__wid=1).state == "INITIALIZING"
    done = alice_signed_in.post(f"/experiments/{exp.id}/actions", {"action": "stop", "wid": ["1", "3"], "confirm": "yes"})
    body = done.content.decode()
    assert 'data-wid="1"><td class="num"><a href="/experiments/' in body
    assert body.count("result-ok") == 1 and body.count("result-bad") == 1 and "already COMPLETED" in body
    assert WorkUnitExecution.objects.get(work_unit__experiment=exp, work_unit__wid=1).state == "STOPPING"
    alice_signed_in.post(f"/experiments/{exp.id}/actions", {"action": "restart", "wid": ["3"], "confirm": "yes"})
    assert WorkUnitExecution.objects.get(work_unit__experiment=exp, work_unit__wid=3, eid=2).state == "RESTARTING"


def test_it_refuses_an_action_without_the_csrf_token() -> None:
    pages.person("alice")
    client = Client(enforce_csrf_checks=True)
    client.login(username="alice", password=pages.PASSWORD)
    exp, _ = pages.sweep(ALICE)
    response = client.post(f"/experiments/{exp.id}/actions", {"action": "stop", "wid": "1", "confirm": "yes"})
    assert response.status_code == 403
    assert WorkUnitExecution.objects.get(work_unit__experiment=exp, work_unit__wid=1).state == "INITIALIZING"


def test_it_prints_hostile_values_as_text_and_links_only_http(alice_signed_in: Client) -> None:
    exp = factories.experiment(
        creator=ALICE, title=pages.HOSTILE, notes=pages.HOSTILE,
        urls=[pb.url.Url(url="javascript:alert(3)", display_name="evil"),
              pb.url.Url(url="https://example.com/board", display_name="board")],
    )
    message = factories.work_unit_message()
    message.executable.jobset.jobs[0].spec.args["flag"] = pages.HOSTILE
    message.notes = pages.HOSTILE
    from workunits import services

    services.create_work_unit(exp.id, message, work_unit_id=0)
    for path in ("/experiments", f"/experiments/{exp.id}", f"/experiments/{exp.id}/workUnits/1"):
        body = alice_signed_in.get(path).content.decode()
        assert "<script>alert(1)" not in body and "<img src=x" not in body, path
        assert "javascript:" not in body, path
    body = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert 'href="https://example.com/board"' in body and '<span class="linkless">evil</span>' in body


def test_it_shows_the_work_unit_page_with_timeline_history_and_args(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    pages.move(exp.id, 2, 1, "SCHEDULING", "STARTING", "RUNNING", "FAILED")
    body = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/2").content.decode()
    assert 'class="xmc-timeline"' in body and body.count('class="band"') >= 4
    assert 'id="failure"' in body and "<td>lr</td>" in body and "0.01" in body
    assert 'hx-get="/experiments/%d/workUnits/2/logs"' % exp.id in body
    assert alice_signed_in.get(f"/experiments/{exp.id}/workUnits/2?fragment=main").content.decode().startswith('<div id="main"')


def test_it_ships_the_pinned_vendored_files_it_documents() -> None:
    folder = Path(__file__).resolve().parents[2] / "ui" / "static" / "ui" / "vendor"
    readme = (folder / "README.md").read_text()
    shipped = sorted([*folder.glob("*.js"), *folder.glob("*.css")])
    assert {f.name for f in shipped} >= {"htmx-2.0.11.min.js", "uPlot-1.6.32.iife.min.js", "uPlot-1.6.32.min.css"}
    for script in shipped:
        assert hashlib.sha256(script.read_bytes()).hexdigest() in readme, script.name


def test_it_shows_the_logs_panel_with_the_reason_when_the_cluster_cannot_be_read(alice_signed_in: Client) -> None:
    # The test settings point at no cluster: the panel says so, as text, and never answers 500.
    exp, _ = pages.sweep(ALICE)
    panel = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1/logs?q=loss&ts=1&pages=2")
    assert panel.status_code == 200
    body = panel.content.decode()
    assert 'class="error"' in body and "cluster" in body and 'name="q" value="loss"' in body
    assert alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1/logs?replica=<x>").status_code == 404
    assert alice_signed_in.get(f"/experiments/{exp.id}/workUnits/1/logs?eid=9").status_code == 404


def test_it_highlights_search_matches_inside_escaped_text() -> None:
    from ui.views import highlight

    assert highlight("step 3 <b>loss</b> LOSS", "loss") == [
        ("step 3 <b>", False), ("loss", True), ("</b> ", False), ("LOSS", True)]


def test_it_filters_the_list_by_the_state_of_its_work_units(alice_signed_in: Client) -> None:
    running, _ = pages.sweep(ALICE, title="has a running unit", lrs=("0.1",))
    failed, _ = pages.sweep(ALICE, title="has a failed unit", lrs=("0.1",))
    pages.sweep(ALICE, title="only waiting", lrs=("0.1",))
    pages.move(running.id, 1, 1, "SCHEDULING", "STARTING", "RUNNING")
    pages.move(failed.id, 1, 1, "SCHEDULING", "STARTING", "RUNNING", "FAILED")
    only_running = alice_signed_in.get("/experiments?state=running").content.decode()
    assert "has a running unit" in only_running and "has a failed unit" not in only_running
    with_failures = alice_signed_in.get("/experiments?state=failed").content.decode()
    assert "has a failed unit" in with_failures and "only waiting" not in with_failures


def test_it_redraws_one_row_with_its_sweep_columns_for_an_event(alice_signed_in: Client) -> None:
    exp, _ = pages.sweep(ALICE)
    page = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert f'hx-get="/experiments/{exp.id}?fragment=row&amp;wid=2&amp;col=lr"' in page
    pages.move(exp.id, 2, 1, "SCHEDULING")
    row = alice_signed_in.get(f"/experiments/{exp.id}?fragment=row&wid=2&col=lr").content.decode()
    assert row.startswith('<tr id="wu-2"') and 'data-state="SCHEDULING"' in row and '<td class="arg">0.01</td>' in row
    assert 'name="wid"' in row  # the owner may act: the check box stays
    assert alice_signed_in.get(f"/experiments/{exp.id}?fragment=row&wid=9").status_code == 404


def test_it_estimates_a_queued_units_start_from_its_queues_admissions_and_only_with_history(
        alice_signed_in: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from workunits import eta

    monkeypatch.setattr(eta, "ESTIMATE_MEASURED_ERROR", 0.2)  # a method that cleared the 25 % bar in bench/eta.py
    exp = factories.experiment(creator=ALICE, title="queued")
    for _ in range(11):
        factories.work_unit(exp)
    for wid in range(1, 11):  # ten admissions from the queue, two seconds apart
        pages.move(exp.id, wid, 1, "SCHEDULING", "STARTING")
    pages.move(exp.id, 11, 1, "SCHEDULING")
    queued = {"auxiliaryInfo": {"queueInfo": {"positionInQueue": 3, "totalWorkloadsInQueue": 5}}}
    WorkUnitExecution.objects.filter(work_unit__experiment=exp, work_unit__wid=11).update(
        scheduling_information=queued)
    body = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert "position 3 of 5. Estimated start within 6 s (from the queue&#x27;s last 10 admissions)" in body, body
    unit_page = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/11").content.decode()
    assert "Estimated start within 6 s" in unit_page

    # The same unit in a queue that has admitted nothing: its position, and no estimate.
    from workunits.models import WorkUnit

    unit = WorkUnit.objects.get(experiment=exp, wid=11)
    unit.executable["schedulingConstraints"]["queueName"] = "idle-queue"
    WorkUnit.objects.filter(id=unit.id).update(executable=unit.executable)
    body = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert "Waiting for quota in idle-queue: position 3 of 5" in body and "Estimated start" not in body

    # A method whose measured median error is past 25 % of the real wait is not shown at all.
    WorkUnit.objects.filter(id=unit.id).update(executable={**unit.executable, "schedulingConstraints": {
        **unit.executable["schedulingConstraints"], "queueName": "cpu-queue"}})
    assert "Estimated start" in alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    monkeypatch.setattr(eta, "ESTIMATE_MEASURED_ERROR", 0.4)
    body = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert "position 3 of 5" in body and "Estimated start" not in body


def test_it_prints_a_log_line_escaped_with_its_matches_timestamp_and_replica_when_asked() -> None:
    from k8s_bridge.logs.service import LogLine
    from ui.views import log_line_html

    line = LogLine(replica="worker-1", pod="p", container="main", timestamp="2026-12-03T10:00:00Z",
                   text="step <b>2</b> Loss 0.5 loss", source="cluster")
    assert log_line_html(line, needle="", timestamps=False) == (
        '<span class="">step &lt;b&gt;2&lt;/b&gt; Loss 0.5 loss\n</span>')
    assert log_line_html(line, needle="loss", timestamps=True, with_replica=True) == (
        '<span class="hit"><span class="ts">2026-12-03T10:00:00Z </span><span class="rep">[worker-1] </span>'
        "step &lt;b&gt;2&lt;/b&gt; <mark>Loss</mark> 0.5 <mark>loss</mark>\n</span>")


def test_it_says_the_failure_once_on_a_failed_units_page_short_first_details_behind_it(alice_signed_in: Client) -> None:
    from workunits import services as wu_services
    from workunits.state import ExecutionUpdate as Update

    exp, _ = pages.sweep(ALICE)
    pages.move(exp.id, 2, 1, "SCHEDULING", "STARTING", "RUNNING", "FAILED")
    details = ("JobSet failed (FailedJobs): jobset failed due to one or more job failures. replicated job main-0 "
               "(job xmc-1-2-main-0): BackoffLimitExceeded, backoff limit reached after 2 failed pod(s) (backoffLimit 1). "
               "replica main-0 (pod xmc-1-2-main-0-0-abcde) container main exited with code 1 (Error)")
    for text, trace in ((details, None), (details + ". Last lines of replica main-0 are attached", "RuntimeError: boom")):
        message = {"severity": "ERROR", "source": "KUBERNETES", "userFacingText": text,
                   **({"auxiliaryInfo": {"stackTrace": trace}} if trace else {})}
        wu_services.update_work_unit_executions([Update(
            xid=exp.id, wid=2, eid=1, mask=("status.system_message",), system_message=message,
            force_status_message_update=True)])
    body = alice_signed_in.get(f"/experiments/{exp.id}/workUnits/2").content.decode()
    assert body.count("Exited with code 1, twice (retry limit 1)") == 1, re.findall(r"id=\"why\">[^<]*", body)  # the headline
    assert body.count("BackoffLimitExceeded") == 1  # the details, once, folded in the failure card
    assert '<details id="failure-details">' in body and body.count("RuntimeError: boom") == 1
    table = alice_signed_in.get(f"/experiments/{exp.id}").content.decode()
    assert "Exited with code 1, twice (retry limit 1)" in table and "BackoffLimitExceeded" not in table
