"""SIGTERM and SIGHUP end a benchmark as Ctrl-C does, so the processes it started stop with it.

Python's default for SIGTERM ends the process at once, with no ``finally``:
a benchmark killed that way would leave its servers, workers and databases
running. :func:`exit_on_termination` turns either signal into ``SystemExit``
in the main thread; the benchmark's ``finally`` blocks then stop what they
started, and a second signal cannot interrupt that clean-up.
"""
from __future__ import annotations

import signal
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _exit(signum: int, frame: FrameType | None) -> None:
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # the clean-up runs once, to its end
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def exit_on_termination() -> None:
    for sig in SIGNALS:
        signal.signal(sig, _exit)
