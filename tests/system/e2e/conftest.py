"""Helpers of the end-to-end tests on ``system``, the whole system as ``./dev run`` starts it
(tests/fixtures/systems.py).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests import waiting
from tests.fixtures.systems import ROOT as ROOT  # re-exported for the tests here
from tests.fixtures.systems import System as System  # the fixture's class, re-exported for the tests here


def eventually(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.5) -> Any:
    """`tests.waiting.eventually`, polled every half second (each check reads the database or the API)."""
    return waiting.eventually(check, timeout, what, interval=interval)
