"""The researcher's pages as a person sees them, in a real headless Chromium over the real ASGI server.

Debian's ``chromium`` driven by Playwright. The server is uvicorn running
``xmc.asgi:application`` (the event streams on its loop, the pages on the
threaded WSGI side) on the test database; state changes are committed by
the services and handed to the committed hooks as the reconciler does, so a
change reaches the open page through Redis and the server's one
subscription. Screenshots of the three pages go to docs/screenshots/.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core import pb
from tests import factories
from tests.fixtures.browsers import needs_chromium
from tests.ui import pages
from workunits import services as wu_services
from workunits.models import WorkUnitExecution
from workunits.state import ExecutionUpdate

SHOTS = Path(__file__).resolve().parents[3] / "docs" / "screenshots"
pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]
ALICE, BOB = "alice@example.com", "bob@example.com"


def _signed_in(browser: Any, site: str, name: str, width: int = 1440, height: int = 900) -> Any:
    page = browser.new_page(viewport={"width": width, "height": height})
    page.csp_errors = []  # type: ignore[attr-defined]
    page.on("console", lambda m: page.csp_errors.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("dialog", lambda d: (_ for _ in ()).throw(AssertionError(f"a page script ran: {d.message}")))
    page.goto(f"{site}/experiments")
    page.wait_for_url(f"{site}/login?next=%2Fexperiments")
    page.fill("#id_username", name)
    page.fill("#id_password", pages.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site}/experiments")
    return page


def _live(page: Any) -> None:
    page.wait_for_selector("[data-live].on", timeout=5000)


def test_it_signs_in_lists_and_filters(browser: Any, site: str) -> None:
    pages.person("alice")
    pages.sweep(ALICE, title="resnet lr sweep")
    factories.experiment(creator=ALICE, title="bert baseline", tags=["nlp"])
    page = _signed_in(browser, site, "alice")
    assert page.locator("#experiments tbody tr").count() == 2
    page.fill("input[name=q]", "resnet")
    page.click("button:has-text('Apply')")
    page.wait_for_url("**/experiments?q=resnet*")
    rows = page.locator("#experiments tbody tr")
    assert rows.count() == 1 and "resnet lr sweep" in rows.inner_text()
    page.goto(f"{site}/experiments?filter=" + 'tags:"nlp"')
    assert "bert baseline" in page.locator("#experiments tbody").inner_text()
    assert page.locator("#experiments tbody tr").count() == 1
    assert page.csp_errors == []


def test_it_shows_the_sweep_and_a_reconciler_change_without_reload(browser: Any, site: str) -> None:
    pages.person("alice")
    exp, _ = pages.sweep(ALICE)
    page = _signed_in(browser, site, "alice")
    page.goto(f"{site}/experiments/{exp.id}")
    headers = page.locator("#units thead th").all_inner_texts()
    assert "lr" in headers and "batch" not in headers
    assert "batch=64" in page.locator(".shared").inner_text()
    _live(page)
    page.evaluate("window.__marker = 'same page'")
    pages.move(exp.id, 2, 1, "SCHEDULING", "STARTING")
    page.wait_for_selector("#wu-2[data-state=STARTING]", timeout=5000)
    # One committed change, timed from its commit (the test's own writing is not the page's time) to the row
    # showing it, as the page saw it: beside a second suite the test process itself waits for a core before it
    # hears of the change from Playwright.
    _note_when_shown(page, "#wu-2[data-state=RUNNING]")
    committed = pages.move(exp.id, 2, 1, "RUNNING")
    page.wait_for_selector("#wu-2[data-state=RUNNING]", timeout=5000)
    elapsed = page.evaluate("window.__shown") / 1000 - committed
    assert elapsed < 1.0, f"the change took {elapsed:.2f} s to appear"
    assert page.evaluate("window.__marker") == "same page"  # no reload
    page.locator("#summary .counts", has_text="1 running").wait_for(timeout=3000)
    assert page.csp_errors == []


def _note_when_shown(page: Any, selector: str) -> None:
    """Have the page note (``window.__shown``, ``Date.now()``) the moment ``selector`` first matches."""
    page.evaluate("""selector => {
        window.__shown = null;
        new MutationObserver((_, observer) => {
            if (document.querySelector(selector)) { window.__shown = Date.now(); observer.disconnect(); }
        }).observe(document.body, {subtree: true, childList: true, attributes: true});
    }""", selector)


def test_it_updates_the_list_rows_roll_up_without_reload(browser: Any, site: str) -> None:
    pages.person("alice")
    exp, _ = pages.sweep(ALICE, lrs=("0.1", "0.2"))
    page = _signed_in(browser, site, "alice")
    _live(page)
    page.evaluate("window.__marker = 'same page'")
    pages.move(exp.id, 1, 1, "SCHEDULING", "STARTING", "RUNNING")
    # A locator, not wait_for_function: the pages' CSP refuses the eval that would need.
    page.locator(f"tr[data-xid='{exp.id}'] .counts", has_text="1 running").wait_for(timeout=5000)
    assert page.evaluate("window.__marker") == "same page"


def test_it_stops_and_restarts_from_the_page(browser: Any, site: str) -> None:
    pages.person("alice")
    exp, _ = pages.sweep(ALICE)
    page = _signed_in(browser, site, "alice")
    page.goto(f"{site}/experiments/{exp.id}")
    page.check("#wu-1 input[name=wid]")
    page.check("#wu-3 input[name=wid]")
    page.click("#bulk button[value=stop]")
    assert "Stop 2 work units?" in page.inner_text("h1")
    page.click("button[name=confirm]")
    assert page.locator("#results .result-ok").count() == 2
    states = dict(WorkUnitExecution.objects.filter(work_unit__experiment=exp).values_list("work_unit__wid", "state"))
    assert states == {1: "STOPPING", 2: "INITIALIZING", 3: "STOPPING"}
    page.goto(f"{site}/experiments/{exp.id}/workUnits/2")
    page.click("#unit-actions button[value=restart]")
    page.click("button[name=confirm]")
    assert "restart requested" in page.inner_text("#results")
    assert WorkUnitExecution.objects.get(work_unit__experiment=exp, work_unit__wid=2, eid=2).state == "RESTARTING"


def test_it_hides_others_experiments_and_actions_on_a_read_only_one(browser: Any, site: str) -> None:
    pages.person("alice")
    private = factories.experiment(creator=BOB, title="bobs private")
    shared, _ = pages.sweep(BOB, title="bobs shared", acls=pages.shared_with(ALICE))
    page = _signed_in(browser, site, "alice")
    response = page.goto(f"{site}/experiments/{private.id}")
    assert response.status == 404 and "bobs private" not in page.content()
    page.goto(f"{site}/experiments/{shared.id}")
    assert page.locator("#bulk").count() == 0 and page.locator("button:has-text('Stop…')").count() == 0
    assert page.locator("input[name=wid]").count() == 3  # a reader selects units to compare them, nothing more
    page.goto(f"{site}/experiments/{shared.id}/workUnits/1")
    assert page.locator("#unit-actions").count() == 0
    assert page.goto(f"{site}/experiments/{shared.id}/workUnits/42").status == 404


def test_it_stops_live_updates_and_says_why_when_the_share_is_taken_back(browser: Any, site: str,
                                                                         settings: Any) -> None:
    """Issue 40, item 3: the stream's last event is ``denied``; the page closes it (no reconnecting to
    404s) and tells the reader why the page stopped moving."""
    from experiments.models import Experiment

    settings.XMC_STREAM_RECHECK_S = 0.3
    pages.person("alice")
    shared, _ = pages.sweep(BOB, title="bobs shared", acls=pages.shared_with(ALICE))
    page = _signed_in(browser, site, "alice")
    # Every EventSource the page opens, to see its state (2: CLOSED, never to reconnect).
    page.add_init_script("""(() => { const Real = window.EventSource; window.__sources = [];
      window.EventSource = function (url, init) { const s = new Real(url, init); window.__sources.push(s); return s; };
      window.EventSource.prototype = Real.prototype; Object.assign(window.EventSource, Real); })();""")
    page.goto(f"{site}/experiments/{shared.id}")
    _live(page)
    Experiment.objects.filter(id=shared.id).update(acls={})  # Bob takes the share back
    banner = page.wait_for_selector("#stream-denied[role=alert]", timeout=5000)
    assert "no longer have access" in banner.inner_text()
    assert page.locator("[data-live]").first.inner_text() == "access ended"
    states = page.evaluate("window.__sources.filter(s => s.url.includes('/events')).map(s => s.readyState)")
    assert states and set(states) == {2}, states
    assert not page.csp_errors  # type: ignore[attr-defined]


def test_it_shows_hostile_values_as_text(browser: Any, site: str) -> None:
    pages.person("alice")
    exp = factories.experiment(creator=ALICE, title=pages.HOSTILE, notes=pages.HOSTILE,
                               urls=[pb.url.Url(url="javascript:alert(3)", display_name="click me")])
    message = factories.work_unit_message()
    message.executable.jobset.jobs[0].spec.args["flag"] = pages.HOSTILE
    from workunits import services

    services.create_work_unit(exp.id, message, work_unit_id=0)
    page = _signed_in(browser, site, "alice")
    assert pages.HOSTILE in page.locator("#experiments tbody").inner_text()
    page.goto(f"{site}/experiments/{exp.id}")
    assert pages.HOSTILE in page.inner_text("h1")
    assert page.locator("a[href^='javascript']").count() == 0
    assert page.locator("img[src=x]").count() == 0 and page.locator("main script").count() == 0
    page.goto(f"{site}/experiments/{exp.id}/workUnits/1")
    assert pages.HOSTILE in page.inner_text("#args")
    page.wait_for_timeout(300)  # the dialog handler fails the test if anything ran


@pytest.mark.parametrize("width", [390, 1440])
def test_it_fits_a_phone_and_a_desktop_and_takes_the_screenshots(browser: Any, site: str, width: int) -> None:
    pages.person("alice")
    exp, _ = pages.sweep(ALICE, title="resnet50 learning-rate sweep",
                         lrs=("0.3", "0.1", "0.03", "0.01", "0.003", "0.001"))
    factories.experiment(creator=ALICE, title="bert-large pretraining")
    other, _ = pages.sweep(ALICE, title="vit ablation: patch size", lrs=("0.1", "0.2"))
    pages.move(exp.id, 1, 1, "SCHEDULING", "STARTING", "RUNNING", "COMPLETED")
    pages.move(exp.id, 2, 1, "SCHEDULING", "STARTING", "RUNNING")
    # A pod the Job retried once, then the unit failed: the reconciler's ERROR, first without, then with its last lines.
    pages.move(exp.id, 3, 1, "SCHEDULING", "STARTING", "RUNNING", "STARTING", "RUNNING", "FAILED")
    details = (f"JobSet failed (FailedJobs): jobset failed due to one or more job failures (first failed job: "
               f"xmc-{exp.id}-3-main-0). replicated job main-0 (job xmc-{exp.id}-3-main-0): BackoffLimitExceeded, backoff "
               f"limit reached after 2 failed pod(s) (backoffLimit 1). replica main-0 (pod xmc-{exp.id}-3-main-0-0-x7k2p) "
               "container main exited with code 1 (Error)")
    for text, trace in ((details, ""), (f"{details}. Last lines of replica main-0 container main are attached",
                                        "epoch 3/10\nRuntimeError: CUDA error: out of memory")):
        wu_services.update_work_unit_executions([ExecutionUpdate(
            xid=exp.id, wid=3, eid=1, mask=("status.system_message",), force_status_message_update=True,
            system_message={"severity": "ERROR", "source": "KUBERNETES", "userFacingText": text,
                            **({"auxiliaryInfo": {"stackTrace": trace}} if trace else {})})],
            now=pages.last_time())  # after the moves above (they are stamped a second apart, ahead of the clock)
    pages.move(exp.id, 4, 1, "SCHEDULING")
    pages.move(other.id, 1, 1, "SCHEDULING", "STARTING", "RUNNING")
    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)
    SHOTS.mkdir(parents=True, exist_ok=True)
    suffix = "desktop" if width > 400 else "phone"
    for path, name in ((f"/experiments", "experiments"), (f"/experiments/{exp.id}", "experiment"),
                       (f"/experiments/{exp.id}/workUnits/3", "work_unit")):
        page.goto(f"{site}{path}")
        page.wait_for_load_state("networkidle")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        wide = page.evaluate("""Array.from(document.querySelectorAll('body *')).filter(e => {
            const r = e.getBoundingClientRect(); return r.right > window.innerWidth + 1;
        }).slice(0, 5).map(e => e.tagName + '.' + e.className + '#' + e.id + ' ' + Math.round(e.getBoundingClientRect().right))""")
        assert overflow <= 1, f"{path} is {overflow}px wider than a {width}px screen: {wide}"
        text = page.inner_text("body")
        # Said once, short first: the headline once; the cluster's words once, folded, on the unit's page only.
        assert text.count("Exited with code 1, twice (retry limit 1)") == (name != "experiments"), (path, text)
        assert text.count("BackoffLimitExceeded") == 0  # folded (<details>) or not on this page at all
        if name == "work_unit":
            page.click("#failure-details summary")
            assert page.inner_text("body").count("BackoffLimitExceeded") == 1
            assert page.inner_text("body").count("RuntimeError: CUDA error: out of memory") == 1
            assert page.locator('.timeline-legend li:has-text("STARTING (pod retry)")').count() == 1
            if width <= 400:  # the picture's own labels would be 4 px: hidden, the legend says it
                assert not page.locator(".xmc-timeline text").first.is_visible()
        page.screenshot(path=str(SHOTS / f"{name}-{suffix}.png"), full_page=True)
    assert page.csp_errors == []
