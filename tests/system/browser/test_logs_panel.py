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
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests import waiting
from tests.system.cli import rest
from tests.system.e2e.conftest import System, system  # noqa: F401 - the module-scoped live system

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="requires Debian's chromium package (.ci/run installs it)")

CHATTY = "pull=1s;print=hello <b>from</b> main;log=every:1s:step {n} loss {x};run=600s;exit=0"


@pytest.fixture
def page(system: System, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:  # noqa: F811
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
    ui = system.exports["XMANAGER_UI_URL"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(f"{ui}/login")
        page.fill("#id_username", "admin")
        page.fill("#id_password", os.environ.get("XMC_ADMIN_PASSWORD", "admin"))
        page.click("button[type=submit]")
        page.wait_for_url(f"{ui}/experiments")
        yield page
        browser.close()


def test_it_follows_a_running_pod_and_searches_and_downloads(system: System, page: Any) -> None:  # noqa: F811
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
