"""Run a simulator in the foreground until SIGTERM or SIGINT (the ``python -m`` entry points)."""
from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable


def serve_until_signal(name: str, serving: str, stop: Callable[[], str]) -> None:
    """Print ``"<name>: serving <serving>"``, wait for SIGTERM/SIGINT, then ``stop()`` and print what it says."""
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"{name}: serving {serving}", flush=True)
    while not done.wait(0.5):
        pass
    print(f"{name}: stopping", flush=True)
    print(f"{name}: {stop()}", flush=True)


def fail(message: str) -> None:
    """Exit with status 1 and ``message`` on stderr (a port in use, a missing dependency)."""
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(1)
