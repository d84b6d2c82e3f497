"""Charts as a person sees them, in headless Chromium over the real ASGI server, at 390 px and 1440 px.

Points go in through the real write path (``POST .../metrics:write`` with the
execution's metrics token, on the same uvicorn), so a write commits, the
metrics hook publishes through Redis, the server's one subscription hands the
"metrics" event to the page's open stream and the chart script reads its data
again. The tests wait on what the page exposes (each chart's ``data-points``:
the points it drew; ``data-events``: the metrics events it heard), with
generous deadlines, never on a fixed delay: on a loaded 2-core machine a step
may take seconds, and the test still passes as long as the page gets there.
Screenshots go to docs/screenshots/ (metrics-*.png, dashboard-*.png).
"""
from __future__ import annotations

import math
import time
from typing import Any

import pytest
import redis
import requests
from django.conf import settings

from core import pb
from metrics import services, tokens
from tests.fixtures.browsers import needs_chromium
from tests.system.browser.test_researcher_pages import (  # noqa: F401 - fixtures
    ALICE,
    SHOTS,
    _signed_in,
)
from tests.ui import pages
from ui import live
from workunits.models import WorkUnit

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]
M = pb.dashboard
#: How long the page may take to show what was written, on a loaded machine (it usually takes well under 1 s).
DEADLINE_S = 90.0


def _write(site: str, xid: int, wid: int, points: list[dict[str, Any]]) -> None:
    """Through the real write path, with the execution's own token, as a job's writer sends them."""
    answer = requests.post(f"{site}/v1/experiments/{xid}/workUnits/{wid}/metrics:write", json={"points": points},
                           headers={"Authorization": f"Bearer {tokens.token_for(xid, wid, 1)}"}, timeout=30)
    assert answer.status_code == 200, answer.text


def _curve(metric: str, steps: range, f: Any) -> list[dict[str, Any]]:
    return [{"metric": metric, "step": s, "value": f(s)} for s in steps]


def _loss(s: int) -> float:
    return 2.4 * math.exp(-s / 18) + 0.25 + 0.04 * math.sin(s * 1.7)


def _accuracy(s: int) -> float:
    return 0.92 - 0.6 * math.exp(-s / 14) + 0.01 * math.cos(s * 2.3)


def _attribute_at_least(page: Any, selector: str, name: str, at_least: int, deadline_s: float = DEADLINE_S) -> int:
    """Poll the page's ``name`` attribute of ``selector`` until it is >= ``at_least`` (the CSP refuses
    the eval ``wait_for_function`` needs); returns the value seen."""
    deadline = time.monotonic() + deadline_s
    value = -1
    while time.monotonic() < deadline:
        text = page.get_attribute(selector, name)
        value = int(text) if text and text.isdigit() else -1
        if value >= at_least:
            return value
        page.wait_for_timeout(100)
    raise AssertionError(f"{selector} {name}={value} after {deadline_s} s, wanted >= {at_least}; "
                         f"status: {page.inner_text(selector)!r}")


def _fits(page: Any, width: int, what: str) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"{what} is {overflow}px wider than a {width}px screen"


def _figure(title: str) -> str:
    return f"figure[data-chart]:has(.chart-title:text-is('{title}'))"


@pytest.mark.parametrize("width", [390, 1440])
def test_it_draws_the_work_unit_page_s_metrics_and_grows_them_live(browser: Any, site: str, width: int) -> None:
    pages.person("alice")
    exp, _ = pages.sweep(ALICE, title="resnet50 learning-rate sweep", lrs=("0.1", "0.03", "0.01"))
    pages.move(exp.id, 2, 1, "SCHEDULING", "STARTING", "RUNNING")
    _write(site, exp.id, 2, _curve("loss", range(0, 40), _loss) + _curve("accuracy", range(0, 40), _accuracy))
    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)
    page.goto(f"{site}/experiments/{exp.id}/workUnits/2")
    loss, accuracy = _figure("loss"), _figure("accuracy")
    assert page.locator("figure[data-chart]").count() == 2  # a default chart per metric: it has no Chart rows
    _attribute_at_least(page, loss, "data-points", 40)
    _attribute_at_least(page, accuracy, "data-points", 40)
    # The stream is open and the server subscribed ("hello" read): from here on no write is missed.
    page.wait_for_selector("body[data-stream=ready]", timeout=DEADLINE_S * 1000)
    page.wait_for_selector("[data-live].on", timeout=DEADLINE_S * 1000)
    page.evaluate("window.__marker = 'same page'")
    # Points arrive while the page is open: a few small batches, as a job's writer sends them. The
    # last ones fall inside the server's one-second coalescing window; the page still shows them.
    for start in range(40, 60, 4):
        _write(site, exp.id, 2, _curve("loss", range(start, start + 4), _loss))
        page.wait_for_timeout(150)
    assert _attribute_at_least(page, loss, "data-points", 60) == 60
    assert int(page.get_attribute(loss, "data-events") or 0) >= 1  # it heard the stream, no reload, no polling
    assert page.evaluate("window.__marker") == "same page"
    assert page.locator(f"{loss} canvas").count() >= 1 and "No points" not in page.inner_text(loss)
    # A state change re-renders the page's main part; the drawn charts stay (hx-preserve).
    loads = int(page.get_attribute(loss, "data-loads") or 0)
    pages.move(exp.id, 2, 1, "COMPLETED")
    page.locator("#state", has_text="completed").wait_for(timeout=DEADLINE_S * 1000)
    assert page.locator(f"{loss} canvas").count() >= 1 and int(page.get_attribute(loss, "data-loads") or 0) >= loads
    page.wait_for_selector("[data-live].on", timeout=5000)  # the refreshed header still says live
    # A metric that starts later gets its default chart on the open page, without reload.
    _write(site, exp.id, 2, _curve("learning_rate", range(0, 60), lambda s: 0.1 * 0.97 ** s))
    page.locator(_figure("learning_rate")).wait_for(timeout=DEADLINE_S * 1000)
    assert _attribute_at_least(page, _figure("learning_rate"), "data-points", 60) == 60
    assert page.locator("figure[data-chart]").count() == 3
    assert page.evaluate("window.__marker") == "same page"
    _fits(page, width, "the work unit page")
    suffix = "desktop" if width > 400 else "phone"
    SHOTS.mkdir(parents=True, exist_ok=True)
    if width > 400:
        page.screenshot(path=str(SHOTS / f"metrics-{suffix}.png"), full_page=True)
    else:  # a phone: the Metrics section at the top of the screen
        page.evaluate("document.getElementById('metrics').scrollIntoView(); window.scrollBy(0, -12)")
        page.screenshot(path=str(SHOTS / f"metrics-{suffix}.png"))
    assert page.csp_errors == []



def test_it_charts_a_metric_that_began_while_the_stream_was_away_or_inside_another_s_coalescing_window(
        browser: Any, site: str) -> None:
    """The Metrics section reads the server again on the stream's "hello" and a window after each "metrics"
    event, as the charts do: a new metric's own message may never come (nothing reaches a page that is not
    yet subscribed; the shared gate holds back what is written within a window of the last message)."""
    pages.person("alice")
    exp, _ = pages.sweep(ALICE, title="resnet50 learning-rate sweep", lrs=("0.1", "0.03"))
    pages.move(exp.id, 1, 1, "SCHEDULING", "STARTING", "RUNNING")
    _write(site, exp.id, 1, _curve("loss", range(0, 20), _loss))
    page = _signed_in(browser, site, "alice", width=1440, height=900)
    away: list[Any] = []
    reads: list[str] = []  # the section's reads, in order; from `first_of_window` on, the first is answered 204
    first_of_window: list[int] = []

    def is_stream(url: str) -> bool:
        return "/events" in url

    def hold(route: Any) -> None:
        away.append(route)

    def is_section(url: str) -> bool:
        return "fragment=metrics" in url

    def section_read(route: Any) -> None:
        reads.append(route.request.url)
        if first_of_window and len(reads) == first_of_window[0] + 1:
            route.fulfill(status=204)
        else:
            route.continue_()

    def answered(request: Any) -> None:
        if is_section(request.url):
            finished.append(request.url)

    finished: list[str] = []  # the section's reads that have their answer
    page.on("requestfinished", answered)
    page.route(is_section, section_read)
    page.route(is_stream, hold)  # the page's event stream waits here, not yet subscribed
    page.goto(f"{site}/experiments/{exp.id}/workUnits/1", wait_until="domcontentloaded")
    _attribute_at_least(page, _figure("loss"), "data-points", 20)
    deadline = time.monotonic() + DEADLINE_S
    while not away and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert away, "the page never opened its event stream"
    _write(site, exp.id, 1, _curve("accuracy", range(0, 20), _accuracy))  # its message reaches no page
    away[0].continue_()
    page.unroute(is_stream)
    page.locator(_figure("accuracy")).wait_for(timeout=DEADLINE_S * 1000)  # read on "hello"
    page.wait_for_selector("body[data-stream=ready]", timeout=DEADLINE_S * 1000)
    deadline = time.monotonic() + DEADLINE_S
    while len(finished) < 2 and time.monotonic() < deadline:  # "hello"'s read and its read a window later,
        page.wait_for_timeout(50)  # answered: neither can bring what is written next
    assert len(finished) >= 2, reads

    # Inside another message's window: the gate is shut, so the write sends nothing; the message that shut it
    # reaches the page, whose first read comes back "nothing new" (it reached the server before the write).
    shared = redis.Redis.from_url(settings.REDIS_URL)
    shared.set(live.metrics_gate(exp.id, 1), "1", px=60_000)
    try:
        _write(site, exp.id, 1, _curve("learning_rate", range(0, 20), lambda s: 0.1 * 0.97 ** s))
        first_of_window.append(len(reads))
        shared.publish(live.channel(), f"{live.EPHEMERAL} {live.metrics_event(exp.id, 1, 1)}")
        page.locator(_figure("learning_rate")).wait_for(timeout=DEADLINE_S * 1000)  # read a window later
    finally:
        shared.delete(live.metrics_gate(exp.id, 1))
    assert len(reads) >= first_of_window[0] + 2 and page.locator("figure[data-chart]").count() == 3
    assert page.csp_errors == []

def _chart(xid: int, wid: int, chart_id: str, title: str, *plots: Any) -> Any:
    unit = WorkUnit.objects.get(experiment_id=xid, wid=wid)
    return services.create_chart(unit, M.Chart(title=title, plots=list(plots),
                                               plot_layout=M.LayoutSpec(type=M.LayoutSpec.GRID, columns=1)),
                                 chart_id, creator=ALICE)


@pytest.mark.parametrize("width", [390, 1440])
def test_it_lays_out_and_draws_a_dashboard_page_s_charts(browser: Any, site: str, width: int) -> None:
    pages.person("alice")
    exp, _ = pages.sweep(ALICE, title="resnet50 learning-rate sweep", lrs=("0.1", "0.03", "0.01"))
    for wid, scale in ((1, 1.0), (2, 0.8), (3, 1.3)):
        _write(site, exp.id, wid, _curve("loss", range(0, 80), lambda s, k=scale: _loss(s) * k)
               + _curve("accuracy", range(0, 80), lambda s, k=scale: min(0.99, _accuracy(s) / k ** 0.2)))
    loss = _chart(exp.id, 1, "loss-lr-0-1", "Training loss · lr 0.1",
                  M.PlotSpec(plot_id="loss", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                             geoms=[M.GeomSpec(type=M.GeomSpec.LINE), M.GeomSpec(type=M.GeomSpec.HLINE,
                                                                                  yintercept=0.3)]))
    smooth = _chart(exp.id, 2, "loss-lr-0-03", "Smoothed loss · lr 0.03",
                    M.PlotSpec(plot_id="smooth", type=M.SCATTER, data=M.DataSpec(metrics=["loss"]),
                               stats=M.StatSpec(type=M.StatSpec.SMOOTH, smooth=M.StatSpec.SmoothConfig(
                                   algorithm=M.StatSpec.SmoothConfig.EXPONENTIAL, alpha=0.3))))
    accuracy = _chart(exp.id, 3, "acc-lr-0-01", "Accuracy · lr 0.01",
                      M.PlotSpec(plot_id="acc", type=M.SCATTER, data=M.DataSpec(metrics=["accuracy"]),
                                 geoms=[M.GeomSpec(type=M.GeomSpec.AREA)]),
                      M.PlotSpec(plot_id="latest", type=M.SUMMARY_BOX, data=M.DataSpec(metrics=["accuracy", "loss"])))
    # A noisy metric of many steps as a ribbon (each bucket's min to max, no line: more steps than
    # pixels, so the points come as buckets), and the accuracy per step as bars.
    _write(site, exp.id, 1, _curve("grad_norm", range(0, 4000),
                                   lambda s: 3 * math.exp(-s / 900) + 0.4 + 0.3 * math.sin(s * 0.9) * math.cos(s * 0.13)))
    spread = _chart(exp.id, 1, "loss-spread", "Gradient norm · min to max per bucket · lr 0.1",
                    M.PlotSpec(plot_id="spread", type=M.SCATTER, data=M.DataSpec(metrics=["grad_norm"]),
                               geoms=[M.GeomSpec(type=M.GeomSpec.RIBBON)]))
    bars = _chart(exp.id, 2, "acc-bars", "Accuracy by step · lr 0.03",
                  M.PlotSpec(plot_id="bars", type=M.SCATTER, data=M.DataSpec(metrics=["accuracy"]),
                             geoms=[M.GeomSpec(type=M.GeomSpec.BAR)]))
    layout = M.LayoutSpec(type=M.LayoutSpec.GRID, columns=2, positions=[
        M.GridPosition(item_id="loss-lr-0-1", x=0, y=0, width=2, height=1),
        M.GridPosition(item_id="loss-lr-0-03", x=0, y=1), M.GridPosition(item_id="acc-lr-0-01", x=1, y=1),
        M.GridPosition(item_id="loss-spread", x=0, y=2), M.GridPosition(item_id="acc-bars", x=1, y=2)])
    services.create_dashboard(M.Dashboard(title="resnet50 sweep: loss and accuracy",
                                          description="The three learning rates side by side.", chart_layout=layout),
                              "resnet-sweep", owner=ALICE, referenced=[loss, smooth, accuracy, spread, bars], inline=[])
    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)
    page.click("header.top a:text-is('Dashboards')")
    page.wait_for_url(f"{site}/dashboards")
    page.click("a:text-is('resnet50 sweep: loss and accuracy')")
    page.wait_for_url(f"{site}/dashboards/resnet-sweep")
    for chart_id in ("loss-lr-0-1", "loss-lr-0-03", "acc-lr-0-01", "loss-spread", "acc-bars"):
        _attribute_at_least(page, f"#c-{chart_id}", "data-points", 80)
    for chart_id in ("loss-spread", "acc-bars"):  # drawn (a canvas), not "No points"
        assert page.locator(f"#c-{chart_id} canvas").count() >= 1, chart_id
    assert page.locator("#c-acc-lr-0-01 table.summary tbody tr").count() == 2
    wide = page.locator("#c-loss-lr-0-1").bounding_box()
    half = page.locator("#c-loss-lr-0-03").bounding_box()
    beside = page.locator("#c-acc-lr-0-01").bounding_box()
    if width > 400:  # the layout's grid: the first chart spans both columns, the other two share a row
        assert wide["width"] > 1.8 * half["width"] and abs(half["y"] - beside["y"]) < 2 and beside["x"] > half["x"]
    else:  # a phone: one column, in the dashboard's order
        assert abs(wide["width"] - half["width"]) < 2 and wide["y"] < half["y"] < beside["y"]
    _fits(page, width, "the dashboard page")
    suffix = "desktop" if width > 400 else "phone"
    page.screenshot(path=str(SHOTS / f"dashboard-{suffix}.png"), full_page=True)
    page.goto(f"{site}/dashboards")
    _fits(page, width, "the dashboards list")
    assert page.csp_errors == []
