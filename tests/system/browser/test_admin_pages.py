"""The operators' pages as a person sees them, in a real headless Chromium.

Debian's ``chromium`` driven by Playwright (``executable_path``; Playwright's
own browser download is not used). The admin is served by a live server on
the test database; the data comes from the real services.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests import factories
from tests.fixtures.browsers import needs_chromium
from tests.fixtures.people import PASSWORD
from workunits import services
from workunits.models import WorkUnitExecution
from workunits.state import ExecutionUpdate

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def page(live_server: object, browser: Any, olivia: object) -> object:
    """Olivia's admin, signed in (Chromium: the ``browser`` fixture of ``tests.fixtures.browsers``)."""
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(f"{live_server}/admin/login/")
    page.fill("#id_username", "olivia")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server}/admin/")
    return page


def _run_through(wu: object, *states: str) -> None:
    t = time.time_ns()
    for i, state in enumerate(states):
        services.update_work_unit_executions(
            [ExecutionUpdate(xid=wu.experiment_id, wid=wu.wid, eid=1, mask=("status.state",),  # type: ignore[attr-defined]
                             state=state, state_update_time_ns=t + i)],
            now=timezone.now() + timedelta(seconds=20 * (i + 1)),
        )


def test_it_styles_the_admin(page: object, live_server: object) -> None:
    header = page.locator("#header")  # type: ignore[attr-defined]
    # Django's base.css paints the header; unstyled HTML has a transparent one.
    assert header.evaluate("e => getComputedStyle(e).backgroundColor") not in ("rgba(0, 0, 0, 0)", "transparent")
    assert page.locator("link[href$='admin/css/base.css']").count() == 1  # type: ignore[attr-defined]


def test_it_shows_executions_history_messages_and_a_timeline(page: object, live_server: object) -> None:
    exp = factories.experiment(title="browser")
    wu = factories.work_unit(exp)
    _run_through(wu, "SCHEDULING", "STARTING", "RUNNING", "COMPLETED")
    page.goto(f"{live_server}/admin/workunits/workunit/{wu.id}/change/")  # type: ignore[attr-defined]
    body = page.inner_text("body")  # type: ignore[attr-defined]
    assert "Completed" in body and "EXECUTIONS" in body.upper() and "STATUS MESSAGES" in body.upper()
    picture = page.locator(".xmc-execution-timeline svg")  # type: ignore[attr-defined]
    assert picture.count() == 1
    box = picture.bounding_box()
    assert box and box["width"] > 500 and box["height"] > 30
    bands = picture.locator("g.band")
    assert [bands.nth(i).get_attribute("data-state") for i in range(bands.count())] == [
        "INITIALIZING", "SCHEDULING", "STARTING", "RUNNING", "COMPLETED"]
    # The execution's own page: its history rows and the same picture.
    ex = WorkUnitExecution.objects.get(work_unit=wu, eid=1)
    page.goto(f"{live_server}/admin/workunits/workunitexecution/{ex.id}/change/")  # type: ignore[attr-defined]
    assert page.locator(".xmc-execution-timeline svg g.band").count() == 5  # type: ignore[attr-defined]
    assert "RUNNING" in page.inner_text("body").upper()  # type: ignore[attr-defined]


def test_it_stops_and_restarts_from_the_page(page: object, live_server: object) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    page.goto(f"{live_server}/admin/workunits/workunit/")  # type: ignore[attr-defined]
    page.check(f"input[name=_selected_action][value='{wu.id}']")  # type: ignore[attr-defined]
    page.select_option("select[name=action]", "stop_work_units")  # type: ignore[attr-defined]
    page.click("button[name=index]")  # type: ignore[attr-defined]
    assert "Stopping 1 work unit" in page.inner_text("ul.messagelist")  # type: ignore[attr-defined]
    assert WorkUnitExecution.objects.get(work_unit=wu, eid=1).state == "STOPPING"

    page.check(f"input[name=_selected_action][value='{wu.id}']")  # type: ignore[attr-defined]
    page.select_option("select[name=action]", "restart_work_units")  # type: ignore[attr-defined]
    page.click("button[name=index]")  # type: ignore[attr-defined]
    assert "Restarted 1 work unit" in page.inner_text("ul.messagelist")  # type: ignore[attr-defined]
    assert WorkUnitExecution.objects.get(work_unit=wu, eid=2).state == "RESTARTING"


def test_it_pauses_and_resumes_scheduling_from_the_page(page: object, live_server: object,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from workunits import scheduling
    from workunits.models import SchedulingSwitch, SchedulingSwitchChange

    dispatched: list[object] = []
    monkeypatch.setattr(scheduling, "_dispatch_run", lambda run_id, batch_size: dispatched.append(run_id))
    scheduling.ensure_switch()
    switch = SchedulingSwitch.objects.get()
    page.goto(f"{live_server}/admin/workunits/schedulingswitch/")  # type: ignore[attr-defined]
    page.check(f"input[name=_selected_action][value='{switch.pk}']")  # type: ignore[attr-defined]
    page.select_option("select[name=action]", "pause_scheduling")  # type: ignore[attr-defined]
    page.click("button[name=index]")  # type: ignore[attr-defined]
    # The action asks for a reason before it pauses anything.
    assert not scheduling.is_paused()
    page.fill("#id_reason", "cluster upgrade")  # type: ignore[attr-defined]
    page.click("input[name=apply]")  # type: ignore[attr-defined]
    assert "Scheduling paused" in page.inner_text("ul.messagelist")  # type: ignore[attr-defined]
    assert scheduling.is_paused()
    assert SchedulingSwitchChange.objects.get(paused=True).reason == "cluster upgrade"

    page.check(f"input[name=_selected_action][value='{switch.pk}']")  # type: ignore[attr-defined]
    page.select_option("select[name=action]", "resume_scheduling")  # type: ignore[attr-defined]
    page.click("button[name=index]")  # type: ignore[attr-defined]
    assert "Scheduling resumed" in page.inner_text("ul.messagelist")  # type: ignore[attr-defined]
    assert not scheduling.is_paused() and len(dispatched) == 1
