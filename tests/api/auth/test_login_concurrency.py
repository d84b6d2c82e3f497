"""Two exchanges of the same code at the same moment: exactly one token.

Each thread is its own "CLI" with its own database connection, on a database
where commits are real (transaction=True), so the conditional UPDATE that
claims the code is what decides -- not a test transaction.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections
from django.test import Client

import xmc.auth.services as services
from tests.api.auth.cli_steps import authorize, code_from_page, exchange, login_path, pkce_pair
from xmc.models import CliAuthorizationCode

pytestmark = pytest.mark.django_db(transaction=True)


def _run_in_threads(count: int, work: Callable[[], Any]) -> list[Any]:
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        try:
            results[index] = work()
        finally:
            connections.close_all()  # this thread's connections only

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def _issued_code(user: Any) -> tuple[str, str]:
    browser = Client()
    browser.force_login(user)
    verifier, challenge = pkce_pair()
    return code_from_page(authorize(browser, login_path("s", challenge))), verifier


def test_it_gives_exactly_one_token_when_both_exchanges_pass_the_checks_together(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, verifier = _issued_code(alice)
    # Hold both exchanges between their checks and their claim, so both have
    # seen an unused code before either marks it used: the worst interleaving.
    both_checked = threading.Barrier(2, timeout=10)
    real_lookup = services.identity_for_email

    def lookup_then_wait(email: str) -> Any:
        identity = real_lookup(email)
        both_checked.wait()
        return identity

    monkeypatch.setattr(services, "identity_for_email", lookup_then_wait)

    responses = _run_in_threads(2, lambda: exchange(Client(), code, verifier))

    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200, 400]
    loser = next(response for response in responses if response.status_code == 400)
    assert loser.json()["error"] == "invalid_grant"
    assert "already used" in loser.json()["error_description"]
    assert CliAuthorizationCode.objects.get().used_at is not None


def test_it_gives_one_token_to_a_crowd_of_exchanges(alice: Any) -> None:
    code, verifier = _issued_code(alice)
    start = threading.Barrier(6, timeout=10)

    def exchange_at_once() -> Any:
        client = Client()
        start.wait()
        return exchange(client, code, verifier)

    responses = _run_in_threads(6, exchange_at_once)

    assert sorted(r.status_code for r in responses) == [200, 400, 400, 400, 400, 400]
