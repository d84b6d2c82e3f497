"""The subscription pages as a person uses them, in Debian's Chromium over the real ASGI server.

A webhook subscription made from the form to a real loopback receiver (it verifies the
signature with the Standard Webhooks library, using the secret the page showed once);
"Send a test event" from the page goes through a real Celery worker on the
``notifications`` queue, and the delivery shows in the page's log with the receiver's
answer. "Notify me" on an experiment page. 390 px and 1440 px without horizontal
scrolling or a CSP violation; screenshots into docs/screenshots/.
"""
from __future__ import annotations

from typing import Any

import pytest

from notifications.models import Delivery
from tests import factories
from tests.fixtures.browsers import needs_chromium
from tests.notifications.conftest import Receiver, receiver  # noqa: F401 - fixture
from tests.notifications.test_worker import broker, start_worker  # noqa: F401 - fixtures
from tests.system.browser.test_researcher_pages import SHOTS, _signed_in  # noqa: F401
from tests.ui import pages

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]
ALICE = "alice@example.com"


def _fits(page: Any, width: int) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    wide = page.evaluate("""Array.from(document.querySelectorAll('body *')).filter(e => {
        const r = e.getBoundingClientRect(); return r.right > window.innerWidth + 1;
    }).slice(0, 5).map(e => e.tagName + '.' + e.className + '#' + e.id + ' ' + Math.round(e.getBoundingClientRect().right))""")
    assert overflow <= 1, f"{page.url} is {overflow}px wider than a {width}px screen: {wide}"


@pytest.mark.parametrize("width", [390, 1440])
def test_it_sends_the_test_event_to_a_webhook_made_on_the_page_and_shows_it_in_the_log(
        browser: Any, site: str, receiver: Receiver, broker: Any, start_worker: Any, settings: Any,
        width: int, tmp_path: Any) -> None:
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]  # the receiver is on loopback (the web side checks too)
    start_worker()
    pages.person("alice")
    exp, _ = pages.sweep(ALICE, title="resnet50 learning-rate sweep")
    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)
    suffix = "desktop" if width > 400 else "phone"

    # "Notify me" on the experiment page: an email subscription to that experiment.
    page.goto(f"{site}/experiments/{exp.id}")
    page.click("form.notify-me button")
    page.wait_for_url(f"{site}/subscriptions/*")
    assert f"experiment {exp.id}" in page.inner_text("#summary") and "email" in page.inner_text("#summary")

    # A signed webhook from the form; its secret is on this answer only.
    page.click("header.top a[href='/subscriptions']")
    page.check("input[name=what][value=mine]")
    page.check("input[name=channel][value=webhook]")
    page.check("input[name=events][value=WORK_UNIT_QUEUED_TOO_LONG]")
    page.fill("input[name=quiet_start]", "23:00")
    page.fill("input[name=quiet_end]", "06:00")
    # A private address is refused next to the URL field; the rest of the form stays as typed.
    page.fill("input[name=url]", "http://10.0.0.7/hook")
    page.click("#create button[type=submit]")
    assert "private" in page.inner_text("#f-url .field-error")
    assert page.is_checked("input[name=channel][value=webhook]") and page.is_checked("input[name=what][value=mine]")
    assert page.input_value("input[name=quiet_start]") == "23:00"
    _fits(page, width)
    page.screenshot(path=str(tmp_path / f"refused-{suffix}.png"), full_page=True)
    page.fill("input[name=url]", receiver.url)
    page.click("#create button[type=submit]")
    secret = page.inner_text("#secret [data-secret]").strip()
    assert secret.startswith("whsec_")
    receiver.secret = secret
    _fits(page, width)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"subscriptions-{suffix}.png"), full_page=True)
    page.goto(f"{site}/subscriptions")  # a re-read never shows it again
    assert "whsec_" not in page.content()
    assert page.locator("#subscriptions tbody tr").count() == 2

    # Send a test event from the subscription's page; it shows in the log once delivered.
    page.locator("#subscriptions tbody tr", has_text="all my experiments").locator("a").first.click()
    page.click("#actions button[value=test]")
    page.wait_for_url("**/subscriptions/*?sent=1")
    assert "on its way" in page.inner_text("#sent")
    page.evaluate("window.__marker = 'same page'")

    # The log re-reads itself while the message is on its way: no reload.
    page.locator("#deliveries tbody tr .d-DELIVERED").wait_for(timeout=60_000)
    row = page.locator("#deliveries tbody tr").first
    assert page.evaluate("window.__marker") == "same page"  # not reloaded
    assert page.locator("#log[hx-trigger]").count() == 0  # and it stopped re-reading
    assert len(receiver.requests) == 1 and receiver.requests[0].verified
    assert receiver.requests[0].json["type"] == "test"
    message_id = receiver.requests[0].headers["webhook-id"]
    assert message_id in row.inner_text() and "200" in row.inner_text() and "test" in row.inner_text()
    assert Delivery.objects.get(message_id=message_id).attempts == 1
    _fits(page, width)
    page.screenshot(path=str(SHOTS / f"subscription-{suffix}.png"), full_page=True)

    # The list shows the last delivery's status.
    page.goto(f"{site}/subscriptions")
    assert "delivered" in page.locator("#subscriptions tbody tr", has_text="all my experiments").inner_text()
    assert page.csp_errors == []
