"""The sweep table and a dashboard over every unit, as a person sees them in a real Chromium (390 and 1440 px).

A 12-unit ``lr x batch`` sweep whose units wrote ``loss`` and ``accuracy`` through the real write
path (``metrics:write`` with each execution's token, so the summaries come from ingest): the
experiment page shows metric columns with the best marked, sorting by ``loss`` puts the best unit
first, ``args.lr = 0.01`` filters, the CSV export has the table's rows in its order, a phone says the
table scrolls and keeps the "why" column readable, and a chart made on the page over every unit
draws one series per unit with their names in the legend. Screenshots go to docs/screenshots/.
"""
from __future__ import annotations

import csv
import io
import math
from typing import Any

import pytest

from tests.fixtures.browsers import needs_chromium
from tests.system.browser.test_charts import _attribute_at_least, _fits, _write
from tests.system.browser.test_researcher_pages import (  # noqa: F401 - fixtures
    ALICE,
    SHOTS,
    _signed_in,
)
from tests.ui import pages

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]
LRS = ("0.1", "0.03", "0.01", "0.003", "0.001", "0.0003")
BATCHES = ("32", "128")


def final_loss(lr: str, batch: str) -> float:
    """The sweep's optimum is lr = 0.01 (log(0.01) = -4.6), the smaller batch a little better."""
    return (math.log(float(lr)) + 4.6) ** 2 / 10 + int(batch) / 1000 + 0.05


def _sweep(site: str) -> Any:
    from tests import factories
    from workunits import services

    exp = factories.experiment(creator=ALICE, title="resnet50 lr x batch sweep")
    wid = 0
    for lr in LRS:
        for batch in BATCHES:
            wid += 1
            message = factories.work_unit_message(name="train")
            message.executable.jobset.jobs[0].spec.args.update({"lr": lr, "batch_size": batch, "epochs": "30"})
            message.tags.extend(["baseline"] if lr == "0.1" else [])
            services.create_work_unit(exp.id, message, work_unit_id=0)
            end = final_loss(lr, batch)
            _write(site, exp.id, wid, [
                {"metric": "loss", "step": s, "value": end + 2.0 * math.exp(-s / 8)} for s in range(0, 40)] + [
                {"metric": "accuracy", "step": s, "value": 0.95 - end / 5 - 0.5 * math.exp(-s / 6)}
                for s in range(0, 40)])
    return exp


def _table_wids(page: Any) -> list[int]:
    return [int(w) for w in page.locator("#units tbody tr").evaluate_all("rows => rows.map(r => r.dataset.wid)")]


@pytest.mark.parametrize("width", [390, 1440])
def test_it_ranks_filters_and_exports_the_sweep_table_and_draws_every_unit_on_a_dashboard(browser: Any, site: str,
                                                                               width: int) -> None:
    pages.person("alice")
    exp = _sweep(site)
    for wid, states in ((1, ("SCHEDULING", "STARTING", "RUNNING", "COMPLETED")), (2, ("SCHEDULING",))):
        pages.move(exp.id, wid, 1, *states)
    best = min(range(12), key=lambda i: final_loss(LRS[i // 2], BATCHES[i % 2])) + 1
    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)
    suffix = "desktop" if width > 400 else "phone"

    page.goto(f"{site}/experiments/{exp.id}")
    headers = page.locator("#units thead th").all_inner_texts()
    assert any(h.startswith("loss") for h in headers) and any(h.startswith("accuracy") for h in headers)
    assert "lr" in headers and "batch_size" in headers and "epochs" not in headers
    assert page.inner_text("#unit-count").startswith("1–12 of 12 work units")
    starred = page.locator("#units td.best[data-metric=loss]")
    assert starred.count() == 1 and starred.locator("xpath=..").get_attribute("data-wid") == str(best)

    page.click("#units thead a:text-is('loss')")  # sort by the metric: lower is better, so ascending
    page.wait_for_url("**sort=metric%3Aloss*")
    ranked = _table_wids(page)
    expected = sorted(range(1, 13), key=lambda w: (final_loss(LRS[(w - 1) // 2], BATCHES[(w - 1) % 2]), w))
    assert ranked == expected and ranked[0] == best

    if width <= 400:  # a phone: the table scrolls inside its box, says so, and "why" stays readable
        assert page.locator(".scroll-hint").is_visible()
        assert page.evaluate("(() => { const b = document.querySelector('[data-scroll]');"
                             " return b.scrollWidth > b.clientWidth; })()")
        why = page.locator("#wu-2 td.why").bounding_box()
        assert why["width"] >= 150, why
    else:
        assert not page.locator(".scroll-hint").is_visible()
    _fits(page, width, "the sweep table")
    page.screenshot(path=str(SHOTS / f"sweep-table-{suffix}.png"), full_page=True)

    page.fill("input[name=filter]", "args.lr = 0.01")
    page.click("button:text-is('Filter')")
    page.wait_for_url("**filter=args.lr*")
    assert sorted(_table_wids(page)) == [5, 6]
    assert "of 2 work units matching the filter" in page.inner_text("#unit-count")
    exported = page.request.get(f"{site}/experiments/{exp.id}{page.locator('#export-csv').get_attribute('href')}")
    rows = list(csv.reader(io.StringIO(exported.text())))
    assert [int(r[0]) for r in rows[1:]] == _table_wids(page)
    loss_at = rows[0].index("metric:loss")
    shown = page.locator("#units td[data-metric=loss]").evaluate_all("cells => cells.map(c => c.dataset.value)")
    assert [float(r[loss_at]) for r in rows[1:]] == [float(v) for v in shown]

    # A chart over every unit, made on the page, on a new dashboard: one series per unit, named.
    page.goto(f"{site}/experiments/{exp.id}/workUnits/1")
    page.click("#new-chart")
    page.fill("input[name=title]", "Loss of every unit")
    page.check("input[name=metrics][value=loss]")
    page.check("input[name=units][value=all]")
    page.select_option("select[name=dashboard]", "new")
    page.fill("input[name=dashboard_title]", "lr x batch")
    page.click("button:text-is('Create chart')")
    page.wait_for_url(f"{site}/dashboards/*")
    _attribute_at_least(page, "figure[data-chart]", "data-points", 12 * 40)
    legend = page.locator("figure[data-chart] .u-legend .u-series:not(.band-edge) th").all_inner_texts()
    named = [text for text in legend if text.startswith("wu ")]
    assert len(named) == 12 and "wu 5 · train" in named, legend
    _fits(page, width, "the dashboard")
    page.screenshot(path=str(SHOTS / f"dashboard-sweep-{suffix}.png"), full_page=True)
    assert page.csp_errors == []


@pytest.mark.parametrize("width", [390, 1440])
def test_it_overlays_the_selected_units_brushes_parallel_coordinates_and_diffs_two_in_compare(browser: Any, site: str,
                                                                                         width: int) -> None:
    pages.person("alice")
    exp = _sweep(site)
    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)
    suffix = "desktop" if width > 400 else "phone"
    page.goto(f"{site}/experiments/{exp.id}")
    for wid in (3, 5, 6, 9):
        page.check(f"#wu-{wid} input[name=wid]")
    page.click("#compare-selected")
    page.wait_for_url("**/compare?wid=3&wid=5&wid=6&wid=9")
    _attribute_at_least(page, "#overlay", "data-points", 4 * 40)
    legend = page.locator("#overlay .u-legend .u-series:not(.band-edge) th").all_inner_texts()
    assert [t for t in legend if t.startswith("wu ")] == ["wu 3 · train", "wu 5 · train", "wu 6 · train",
                                                          "wu 9 · train"]
    assert page.get_attribute("#parallel", "data-brushed") == "4"
    # Brush the lr axis (the second of batch_size, lr, then the metrics) from its bottom to a third up:
    # the smallest lrs only, 0.001 and 0.01 of these (units 5, 6, 9).
    page.locator("#parallel").scroll_into_view_if_needed()
    box = page.locator("#parallel").bounding_box()
    axes = page.evaluate("JSON.parse(document.getElementById('parallel-data').textContent).axes.map(a => a.name)")
    x = box["x"] + 60 + axes.index("lr") * (box["width"] - 120) / (len(axes) - 1)
    bottom, top = box["y"] + 300 - 20, box["y"] + 28
    page.mouse.move(x, bottom + 2)
    page.mouse.down()
    page.mouse.move(x, bottom - (bottom - top) * 0.6, steps=5)
    page.mouse.up()
    assert page.get_attribute("#parallel", "data-brushed") == "3"
    visible = page.locator("#compare-units tbody tr:not([hidden])").evaluate_all("rows => rows.map(r => r.dataset.wid)")
    assert sorted(visible) == ["5", "6", "9"]
    _fits(page, width, "the compare view")
    page.screenshot(path=str(SHOTS / f"compare-{suffix}.png"), full_page=True)

    page.goto(f"{site}/experiments/{exp.id}/compare?wid=5&wid=6&metric=loss")
    assert page.locator("#diff tr.differs[data-name=batch_size]").count() == 1
    assert page.locator("#diff tr.differs[data-name=lr]").count() == 0
    assert page.locator("#diff tr.differs[data-name='loss.last']").count() == 1
    assert page.csp_errors == []
