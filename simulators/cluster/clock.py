"""Simulated time for the cluster simulator.

`SimClock` is the only source of "now" for the simulated controllers
(`simulators.cluster.controllers`): the kubelet stand-in times image pulls and
container runs with it, the JobSet controller applies `ttlSecondsAfterFinished`
with it, and condition timestamps are taken from it.  It runs `speed` times
faster than wall time, starting at the wall-clock epoch time of its creation,
so `--speed 20` makes a `run=30s` pod finish in 1.5 wall seconds while the
timestamps written into objects still look like real, consistent UTC times.

Timers (`SimClock.call_at` / `SimClock.call_later`) run on one daemon thread
owned by the clock; callbacks must be short (they normally only put a key on
a controller work queue).  The simulator entry point (`python -m simulators.cluster`) and the tests
create the clock; nothing else should read `time.time()` for simulated state.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class TimerHandle:
    """A scheduled callback; `cancel()` makes it a no-op if not yet run."""

    __slots__ = ("when", "fn", "cancelled")

    def __init__(self, when: float, fn: Callable[[], object]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SimClock:
    """Simulated epoch seconds running `speed` times faster than wall time."""

    def __init__(self, speed: float = 1.0, start: float | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = float(speed)
        self._wall0 = time.monotonic()
        self._sim0 = time.time() if start is None else float(start)
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # --- reading time -------------------------------------------------------

    def now(self) -> float:
        """Simulated epoch seconds."""
        return self._sim0 + (time.monotonic() - self._wall0) * self.speed

    def wall_seconds(self, sim_seconds: float) -> float:
        """How many wall seconds `sim_seconds` of simulated time take."""
        return max(0.0, sim_seconds) / self.speed

    def sleep(self, sim_seconds: float) -> None:
        """Block the calling thread for `sim_seconds` of simulated time."""
        time.sleep(self.wall_seconds(sim_seconds))

    def rfc3339(self, at: float | None = None) -> str:
        """`YYYY-MM-DDTHH:MM:SSZ` for simulated time `at` (default now)."""
        return format_time(self.now() if at is None else at)

    def micro_time(self, at: float | None = None) -> str:
        """MicroTime `YYYY-MM-DDTHH:MM:SS.ffffffZ` (Event.eventTime)."""
        t = self.now() if at is None else at
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    # --- timers -------------------------------------------------------------

    def call_at(self, sim_time: float, fn: Callable[[], object]) -> TimerHandle:
        """Run `fn()` on the timer thread once simulated time reaches `sim_time`."""
        handle = TimerHandle(sim_time, fn)
        with self._cond:
            if self._stopped:
                handle.cancelled = True
                return handle
            heapq.heappush(self._heap, (sim_time, next(self._seq), handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sim-clock-timers", daemon=True)
                self._thread.start()
            if self._heap[0][2] is handle:
                self._cond.notify()
        return handle

    def call_later(self, sim_delay: float, fn: Callable[[], object]) -> TimerHandle:
        return self.call_at(self.now() + sim_delay, fn)

    def stop(self) -> None:
        """Stop the timer thread; pending timers are dropped."""
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def pending_timers(self) -> int:
        with self._cond:
            return sum(1 for _, _, h in self._heap if not h.cancelled)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    when, _, handle = self._heap[0]
                    if handle.cancelled:
                        heapq.heappop(self._heap)
                        continue
                    delay = self.wall_seconds(when - self.now())
                    if delay <= 0:
                        heapq.heappop(self._heap)
                        break
                    self._cond.wait(timeout=min(delay, 1.0))
                else:
                    return
            try:
                handle.fn()
            except Exception:  # a timer must never kill the timer thread
                log.exception("sim.clock.timer_failed")


def format_time(t: float) -> str:
    """RFC 3339 with second resolution, as Kubernetes serialises metav1.Time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t)))


def parse_time(value: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp (`Z` or offset); None when absent/invalid."""
    if not value:
        return None
    try:
        text = value.replace("Z", "+00:00")
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
