"""Waiting in tests for something another thread or process does: one polling loop for all."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(
    predicate: Callable[[], Any],
    timeout: float = 60.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that.

    ``timeout`` is in wall seconds (generous: the machine may be loaded). An
    exception in ``retry_on`` counts as "not yet". On timeout the
    ``AssertionError`` names ``what``, the last value or error, and what
    ``detail()`` adds (a log tail, say).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    error: BaseException | None = None
    while True:
        try:
            last, error = predicate(), None
        except retry_on as exc:
            error = exc
        if last and error is None:
            return last
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:g}s waiting for {what} (last: {error or last!r})"
            raise AssertionError(message + (f"\n{detail()}" if detail else ""))
        time.sleep(interval)
