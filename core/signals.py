"""How a process hears that it must stop: one helper for servers, one for tooling.

* Servers (the gRPC server, the reconciler) run a loop until told to stop:
  :func:`stop_event` sets an event on the first SIGTERM or SIGINT, and the
  loop waits on it (``event.wait(timeout)`` in the main thread, so the handler
  runs).
* Tooling that starts processes (``scripts/run_all.py``, the benchmarks, the
  test run) must unwind into its clean-up, which stops what it started:
  :func:`raise_on` turns the signals into an exception in the main thread,
  once — from the first signal on, they are ignored, so a second one cannot
  interrupt the clean-up. Python's default for SIGTERM would end the process
  at once, with no ``finally``, and leave its children running.

(The simulators, which import nothing of ours, have their own,
``simulators.serving.serve_until_signal``.)
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType

#: What a terminal, a supervisor or ``kill`` sends to end a tool.
TERMINATION = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def ignore(signals: Iterable[signal.Signals]) -> None:
    for signum in signals:
        signal.signal(signum, signal.SIG_IGN)


def raise_on(signals: Iterable[signal.Signals], make: Callable[[int], BaseException], *,
             also_ignore: Iterable[signal.Signals] = ()) -> None:
    """Each of ``signals`` raises ``make(signum)`` in the main thread, once; from then on ``signals`` and
    ``also_ignore`` are ignored, so the clean-up the exception unwinds into runs to its end."""
    signals = tuple(signals)
    quiet = (*signals, *also_ignore)

    def handler(signum: int, frame: FrameType | None) -> None:
        ignore(quiet)
        raise make(signum)

    for signum in signals:
        signal.signal(signum, handler)


@contextmanager
def stop_event(signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
               on_stop: Callable[[int], None] | None = None) -> Iterator[threading.Event]:
    """An event the first of ``signals`` sets (after ``on_stop(signum)``); the handlers before are restored
    on exit. Must be entered on the main thread (only it may set signal handlers)."""
    stopped = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        if on_stop is not None:
            on_stop(signum)
        stopped.set()

    previous = {signum: signal.signal(signum, handler) for signum in signals}
    try:
        yield stopped
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)
