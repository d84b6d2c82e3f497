"""Issue 40, informational items: canonical metrics tokens, a private /metrics, a strict API browser.

* A metrics token with zero-padded ids (``xmcm1.007.01.1.<sig>``) named the same
  execution as the issued one and verified: a second spelling of one secret.
* The web's ``/metrics`` answered anyone; with ``XMC_METRICS_SCRAPE_TOKEN``
  set it answers only the scraper.
* ``/v1/docs`` keeps a pasted bearer token: it had no Content-Security-Policy
  and kept the token in ``localStorage`` for ever.
"""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from metrics import tokens
from tests import factories
from tests.fixtures.browsers import chromium, needs_chromium
from tests.metrics.conftest import experiment_for, fresh_write_buckets



@pytest.mark.django_db
def test_it_does_not_verify_a_metrics_token_with_zero_padded_ids() -> None:
    unit = factories.work_unit(experiment_for("alice@example.com"), wid=1)
    fresh_write_buckets(unit)
    issued = tokens.token_for(unit.experiment_id, 1, 1)
    _, xid, wid, eid, signature = issued.split(".")
    padded = f"xmcm1.00{xid}.0{wid}.{eid}.{signature}"
    assert tokens.verify(padded) is None and tokens.verify(issued) is not None
    response = Client().post(f"/v1/experiments/{unit.experiment_id}/workUnits/1/metrics:write",
                             json.dumps({"points": [{"metric": "m", "step": 1, "value": 1}]}),
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {padded}")
    assert response.status_code == 401 and response.json()["error"]["status"] == "UNAUTHENTICATED"


def test_it_answers_metrics_only_to_the_scraper_when_a_scrape_token_is_set(settings: Any) -> None:
    settings.XMC_METRICS_SCRAPE_TOKEN = "scrape-secret-0123456789"
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": "scrape-secret-0123456789"}):
        response = Client().get("/metrics", **headers)
        assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
        assert b"xmc_" not in response.content
    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret-0123456789")
    assert scraped.status_code == 200 and b"# TYPE" in scraped.content
    settings.XMC_METRICS_SCRAPE_TOKEN = ""
    assert Client().get("/metrics").status_code == 200  # unset: open, as documented


def test_it_runs_only_the_api_browsers_own_script_and_keeps_no_token_for_ever() -> None:
    response = Client().get("/v1/docs")
    policy = response["Content-Security-Policy"]
    nonce = re.search(r"script-src 'nonce-([A-Za-z0-9_-]+)'", policy)
    assert nonce and "unsafe-inline" not in policy and "default-src 'none'" in policy
    assert "frame-ancestors 'none'" in policy
    page = response.content.decode()
    # Every script and style of the page carries this response's nonce; no inline handlers or styles.
    assert re.findall(r"<script[^>]*>", page) == [f'<script nonce="{nonce.group(1)}">']
    assert re.findall(r"<style[^>]*>", page) == [f'<style nonce="{nonce.group(1)}">']
    assert " style=" not in page and " onclick=" not in page
    assert "localStorage.setItem" not in page and 'sessionStorage.setItem("xmc.token"' in page
    assert Client().get("/v1/docs")["Content-Security-Policy"] != policy  # a fresh nonce per response


@needs_chromium
@pytest.mark.django_db(transaction=True)
def test_it_has_the_api_browser_work_under_its_policy_and_forget_the_token_with_the_tab(
    live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    violations: list[str] = []
    with chromium() as browser:
        context = browser.new_context()
        page = context.new_page()
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        page.goto(f"{live_server.url}/")  # an older page version's token, left in localStorage
        page.evaluate("localStorage.setItem('xmc.token', 'old-token')")
        page.goto(f"{live_server.url}/v1/docs")
        page.wait_for_selector("details[data-search]")  # the script ran: the operations are listed
        page.fill("#token", "pasted-token")
        page.dispatch_event("#token", "change")
        assert page.evaluate("sessionStorage.getItem('xmc.token')") == "pasted-token"
        assert page.evaluate("localStorage.getItem('xmc.token')") is None
        # A new tab (a new session) starts without it.
        other = context.new_page()
        other.goto(f"{live_server.url}/v1/docs")
        assert other.input_value("#token") == ""
    assert violations == []
