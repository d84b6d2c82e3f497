"""A pytest plugin: SIGTERM ends a test run as Ctrl-C does.

Python's default for SIGTERM ends pytest at once, with no fixture teardown,
and every server, worker and simulator a fixture or a test started would be
left running. Turned into ``KeyboardInterrupt``, it makes pytest stop the
test that runs, tear its fixtures down (which stop their processes) and
report; a second SIGTERM cannot interrupt that.
"""
from __future__ import annotations

import signal

import pytest

from core.signals import raise_on


def pytest_configure(config: pytest.Config) -> None:
    raise_on((signal.SIGTERM,), lambda signum: KeyboardInterrupt(f"stopped by signal {signum}"))
