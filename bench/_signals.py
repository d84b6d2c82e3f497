"""SIGTERM and SIGHUP end a benchmark as Ctrl-C does, so the processes it started stop with it.

Python's default for SIGTERM ends the process at once, with no ``finally``:
a benchmark killed that way would leave its servers, workers and databases
running. :func:`exit_on_termination` turns either signal into ``SystemExit``
in the main thread; the benchmark's ``finally`` blocks then stop what they
started, and a second signal cannot interrupt that clean-up.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from core.signals import raise_on  # noqa: E402 - the project's root is on the path first

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def exit_on_termination() -> None:
    """SIGTERM or SIGHUP raises ``SystemExit(128 + signum)``; the clean-up runs once, to its end."""
    raise_on(SIGNALS, lambda signum: SystemExit(128 + signum), also_ignore=(signal.SIGINT,))
