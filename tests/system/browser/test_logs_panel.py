"""The work unit page's logs panel on the whole system: a running pod's new line appears while following.

``scripts/run_all.py`` (the simulator's pods print what their script says),
the real web process (ASGI), Debian's Chromium. The work unit prints a
progress line every second; with Follow on, the panel shows a line the pod
wrote after the page opened, within a second of its timestamp, pushed over
the panel's event stream (``ui.logfollow``).
"""
from __future__ import annotations

import os
import re
import time
from datetime import datetime
from typing import Any

import pytest

from tests import waiting
from tests.fixtures.browsers import needs_chromium
from tests.fixtures.systems import System
from tests.system.cli import rest

pytestmark = needs_chromium

CHATTY = "pull=1s;print=hello <b>from</b> main;log=every:1s:step {n} loss {x};run=600s;exit=0"


@pytest.fixture
def page(system: System, browser: Any) -> Any:  # noqa: F811
    """The admin's session on the system's pages (Chromium: ``tests.fixtures.browsers``)."""
    ui = system.exports["XMANAGER_UI_URL"]
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.goto(f"{ui}/login")
    page.fill("#id_username", "admin")
    page.fill("#id_password", os.environ.get("XMC_ADMIN_PASSWORD", "admin"))
    page.click("button[type=submit]")
    page.wait_for_url(f"{ui}/experiments")
    return page


def test_it_follows_a_running_pod_and_searches_and_downloads(system: System, page: Any) -> None:
    token = system.exports["XMC_AUTH_TOKEN"]
    xid = rest.experiment(system.api, token, "chatty", [rest.work_unit(CHATTY)])
    ui = system.exports["XMANAGER_UI_URL"]

    def running() -> bool:
        unit = rest.call(system.api, token, "GET", f"/v1/experiments/{xid}/workUnits/1")
        return (unit.get("currentWorkUnitExecution") or {}).get("status", {}).get("state") == "RUNNING"

    waiting.eventually(running, 120, "the chatty unit running", interval=0.5)
    page.goto(f"{ui}/experiments/{xid}/workUnits/1")
    page.wait_for_selector("#logtext")
    waiting.eventually(lambda: "step 2 " in (page.reload() and page.wait_for_selector("#logtext") and
                                             page.inner_text("#logtext")), 60, "two progress lines", interval=1.0)
    text = page.inner_text("#logtext")
    assert "hello <b>from</b> main" in text  # markup in a log is text
    assert page.locator("#logtext b").count() == 0

    page.check("input[name=ts]")
    page.wait_for_selector("#logtext .ts")
    streams: list[str] = []
    page.on("response", lambda r: streams.append(r.headers.get("content-type", ""))
            if "/logs/follow" in r.url else None)
    page.check("input[name=follow]")
    page.wait_for_selector("#logtext[data-follow]")
    seen = {line for line in page.inner_text("#logtext").splitlines() if " step " in line}
    deadline = time.monotonic() + 15
    new: list[str] = []
    while time.monotonic() < deadline and not new:
        new = [line for line in page.inner_text("#logtext").splitlines() if " step " in line and line not in seen]
        time.sleep(0.05)
    arrived = datetime.now().astimezone()
    assert new, "no new line while following"
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", new[0].split(" ", 1)[0]).replace("Z", "+00:00")
    written = datetime.fromisoformat(stamp)
    lag = (arrived - written).total_seconds()
    assert lag < 1.0, f"a followed line appeared {lag:.2f} s after the pod wrote it"
    # Each followed line is a line of its own, as the rendered ones are.
    waiting.eventually(lambda: len([line for line in page.inner_text("#logtext").splitlines()
                                    if " step " in line and line not in seen]) >= 2, 10, "two followed lines",
                       interval=0.1)
    followed = [line for line in page.inner_text("#logtext").splitlines() if " step " in line and line not in seen]
    assert all(line.count(" step ") == 1 for line in followed), followed
    # Pushed over the panel's event stream (ui.logfollow), not re-read by polling.
    assert streams and streams[0].startswith("text/event-stream"), streams

    page.uncheck("input[name=follow]")
    page.wait_for_selector("#logtext:not([data-follow])")
    page.fill("input[name=q]", "loss")
    page.press("input[name=q]", "Enter")
    page.wait_for_selector("#logtext mark")
    assert page.locator("#logtext mark").first.inner_text() == "loss"
    assert "matching line" in page.inner_text("#log-matches")

    with page.expect_download() as download:
        page.click("a:has-text('Download')")
    body = open(download.value.path()).read()
    assert "hello <b>from</b> main" in body and "step 1 loss " in body


def _open_unit(system: System, page: Any, script: str, state: str) -> int:
    token = system.exports["XMC_AUTH_TOKEN"]
    xid = rest.experiment(system.api, token, "panel", [rest.work_unit(script)])

    def reached() -> bool:
        unit = rest.call(system.api, token, "GET", f"/v1/experiments/{xid}/workUnits/1")
        return (unit.get("currentWorkUnitExecution") or {}).get("status", {}).get("state") == state

    waiting.eventually(reached, 120, f"the unit {state}", interval=0.5)
    page.goto(f"{system.exports['XMANAGER_UI_URL']}/experiments/{xid}/workUnits/1")
    page.wait_for_selector("#logtext")
    return xid


def test_it_opens_a_running_jobs_log_at_its_newest_line(system: System, page: Any) -> None:
    chatty = ";".join(f"print=line {n:03d}" for n in range(80)) + ";log=every:1s:step {n};run=600s;exit=0"
    _open_unit(system, page, chatty, "RUNNING")
    waiting.eventually(lambda: "line 079" in (page.reload() and page.wait_for_selector("#logtext") and
                                              page.inner_text("#logtext")), 60, "the printed lines", interval=1.0)
    page.wait_for_timeout(300)
    at = page.evaluate("(() => { const p = document.getElementById('logtext');"
                       " return [p.scrollTop + p.clientHeight, p.scrollHeight, p.clientHeight]; })()")
    assert at[1] > at[2] * 1.5, at  # the log is longer than the panel ...
    assert at[0] >= at[1] - 2, at  # ... and the panel shows its end


def test_it_follows_a_container_to_its_last_line(system: System, page: Any) -> None:
    _open_unit(system, page, "pull=1s;log=every:1s:step {n};run=6s;exit=0;stderr=the very last line", "RUNNING")
    page.check("input[name=follow]")
    page.wait_for_selector("#logtext[data-follow]")
    page.wait_for_selector("#logtext[data-follow-ended]", timeout=30000)
    shown = page.inner_text("#logtext").splitlines()
    # The last lines share the time of the last progress line: each of them is kept, none twice.
    assert shown[-2:] == ["the very last line", "[sim] main: exiting with code 0"], shown
    assert len(shown) == len(set(shown)), shown
