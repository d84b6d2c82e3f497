"""A study's page as a person sees it in a real Chromium (390 and 1440 px), live.

Alice's TPE study over ``lr`` and ``batch_size`` (tests/ui/test_study_page.py's: six completed trials,
one pruned at step 6, one running): the experiment page links it; the study page shows the best
trial starred in the trials table, draws the optimisation history, the parallel coordinates and, when
opened, parameter importance over the trials (``lr`` first); sorting by the objective puts the best
trial first; a trial whose result the study controller commits while the page is open appears
without a reload, from that commit's event alone. Screenshots go to
docs/screenshots/study-{phone,desktop}.png.
"""
from __future__ import annotations

from typing import Any

import pytest
from studies import controller
from studies.models import Trial
from tests.fixtures.browsers import needs_chromium
from tests.system.browser.test_charts import _attribute_at_least, _fits
from tests.system.browser.test_researcher_pages import (  # noqa: F401 - fixtures
    ALICE,
    SHOTS,
    _signed_in,
)
from tests.ui import pages
from tests.ui.test_study_page import TRIALS, loss_of, make_study
from tests.ui.test_sweep_table import _write
from workunits.models import WorkUnit

#: How long the page may take to show a committed trial: the event's way through Redis and the page's read
#: (well under a second), with room for a loaded machine; there is no other way for it to learn of the trial.
STUDY_EVENT_S = 10

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


def _numbers(page: Any) -> list[int]:
    return [int(n) for n in page.locator("#trials tbody tr[data-number]").evaluate_all(
        "rows => rows.map(r => r.dataset.number)")]


@pytest.mark.parametrize("width", [390, 1440])
def test_it_shows_the_best_trial_and_its_history_and_follows_the_study_live(browser: Any, site: str,
                                                                                    width: int) -> None:
    pages.person("alice")
    study = make_study()
    xid = study.experiment_id
    best = min((n for n, t in enumerate(TRIALS) if t[2] == "COMPLETED"), key=lambda n: loss_of(*TRIALS[n][:2]))
    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)

    page.goto(f"{site}/experiments/{xid}")
    page.click(f"#studies a[data-study='{study.id}']")
    page.wait_for_url(f"{site}/experiments/{xid}/studies/{study.id}")
    assert _numbers(page) == list(range(len(TRIALS)))
    assert page.locator("#trials tr.best-row").get_attribute("data-number") == str(best)
    assert f"trial {best} " in page.inner_text("#best-trial")
    assert "8 of 12, 1 running" in page.inner_text("#study-progress")
    assert "step 6" in page.locator("#trials tr[data-state=PRUNED]").inner_text()
    _attribute_at_least(page, "#history", "data-points", 6)  # the six completed trials
    assert page.get_attribute("canvas[data-parallel]", "data-brushed") == "7"  # drawn: a line per finished trial

    page.click("#importance summary")
    page.wait_for_selector("#importance-bars tr[data-arg]")
    assert page.locator("#importance-bars tr[data-arg]").first.get_attribute("data-arg") == "lr"

    page.click("#trials thead a:text-is('loss')")  # the objective, lower is better: ascending
    page.wait_for_url("**sort=value*")
    assert _numbers(page)[0] == best

    # A trial ends while the page is open: its unit completes (told to nobody: no event of the unit's)
    # and the study controller commits the trial's result; that commit alone brings the row, the best
    # trial and the history (the study's event on the page's stream), no reload and no poll.
    page.wait_for_selector("body[data-stream=ready]")
    running = Trial.objects.get(study=study, state="RUNNING")
    Trial.objects.filter(id=running.id).update(work_unit=WorkUnit.objects.get(experiment_id=xid, wid=running.wid))
    _write(xid, running.wid, "loss", [2.0, 0.01])
    pages.move(xid, running.wid, 1, "SCHEDULING", "STARTING", "RUNNING", "COMPLETED", publish=False)
    controller.finish_ended_units(study)
    page.wait_for_selector(f"#trials tr.best-row[data-number='{running.number}']", timeout=STUDY_EVENT_S * 1000)
    assert "7 completed" in page.inner_text("#study-summary")
    _attribute_at_least(page, "#history", "data-points", 7)
    _attribute_at_least(page, "canvas[data-parallel]", "data-brushed", 8)  # the new canvas is drawn too

    if width <= 400:
        assert page.evaluate("(() => { const b = document.querySelector('#trials').closest('[data-scroll]');"
                             " return b.scrollWidth >= b.clientWidth; })()")
    _fits(page, width, "the study page")
    page.screenshot(path=str(SHOTS / f"study-{'desktop' if width > 400 else 'phone'}.png"), full_page=True)
    assert page.csp_errors == []  # type: ignore[attr-defined]
