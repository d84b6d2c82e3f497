"""A pytest plugin: SIGTERM ends a test run as Ctrl-C does.

Python's default for SIGTERM ends pytest at once, with no fixture teardown,
and every server, worker and simulator a fixture or a test started would be
left running. Turned into ``KeyboardInterrupt``, it makes pytest stop the
test that runs, tear its fixtures down (which stop their processes) and
report; a second SIGTERM cannot interrupt that.
"""
from __future__ import annotations

import signal
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
