"""A tiny metrics writer for jobs running under XMC: standard library only.

In a container XMC started, the environment names where and as what to write
(``XMC_METRICS_URL``, ``XMC_XID``, ``XMC_WID``, ``XMC_EID``,
``XMC_METRICS_TOKEN``)::

    import xmc_metrics

    for step in range(1000):
        ...
        xmc_metrics.log(step, loss=loss, accuracy=acc)
    xmc_metrics.add_scalar("val/loss", 0.25, step)   # TensorBoard-style

Points are batched and sent by a background thread (every
``flush_interval_s`` or ``batch_size`` points) to
``POST {XMC_METRICS_URL}/v1/experiments/{xid}/workUnits/{wid}/metrics:write``;
a failed send is retried with exponential backoff, never sooner than a 429 or 503 answer's
``Retry-After`` says (the server is idempotent
on (execution, metric, step), so a retried batch never doubles points), and
whatever is pending is flushed when the interpreter exits. Without the
environment every call is a no-op, with one warning. Refused points (HTTP
400, 401, 403) are dropped with a warning, never raised into the job; but
when the server refuses their time (this machine's clock runs ahead of it by
more than ``XMC_METRICS_MAX_FUTURE_S``) they are sent again without one, and
stamped with the server's clock.
"""
from __future__ import annotations

import atexit
import json
import logging
import math
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

__all__ = ["Writer", "add_scalar", "default_writer", "flush", "log"]

logger = logging.getLogger("xmc_metrics")

ENV_VARS = ("XMC_METRICS_URL", "XMC_XID", "XMC_WID", "XMC_EID", "XMC_METRICS_TOKEN")
#: Most points per request (the server takes up to 10,000).
MAX_BATCH = 10_000


def _refused_time(answer: bytes) -> bool:
    """Whether a 400 answer names a point's ``time`` as the bad field."""
    try:
        details = json.loads(answer or b"{}").get("error", {}).get("details") or []
        fields = [str(v.get("field", "")) for d in details for v in d.get("fieldViolations") or []]
    except (ValueError, AttributeError, TypeError):
        return False
    return any(field.endswith(".time") for field in fields)


class Writer:
    """Batches points and sends them from a background thread."""

    def __init__(self, url: str, xid: int, wid: int, eid: int | None, token: str, *, batch_size: int = 1000,
                 flush_interval_s: float = 2.0, max_retries: int = 6, backoff_s: float = 0.5,
                 timeout_s: float = 10.0, max_pending: int = 1_000_000) -> None:
        self.endpoint = f"{url.rstrip('/')}/v1/experiments/{xid}/workUnits/{wid}/metrics:write"
        self.eid = eid
        self.token = token
        self.batch_size = max(1, min(batch_size, MAX_BATCH))
        self.flush_interval_s = flush_interval_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self.written = 0
        self.dropped = 0
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="xmc-metrics", daemon=True)
        self._thread.start()

    # --- Recording ---------------------------------------------------------------

    def log(self, step: int, **values: float) -> None:
        """Record ``values`` (metric name -> number) at ``step``."""
        self._add([(name, step, value) for name, value in values.items()])

    def log_dict(self, step: int, values: Mapping[str, float]) -> None:
        """`log` for metric names that are not Python identifiers (``"val/loss"``)."""
        self._add([(name, step, value) for name, value in values.items()])

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> None:
        """TensorBoard's ``SummaryWriter.add_scalar`` (a missing step counts as 0)."""
        self._add([(tag, 0 if global_step is None else global_step, scalar_value)])

    def _add(self, points: list[tuple[str, int, float]]) -> None:
        now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        batch = []
        for name, step, value in points:
            number = float(value)
            if not math.isfinite(number):
                logger.warning("xmc_metrics: %s at step %s is %s; not sent", name, step, number)
                continue
            batch.append({"metric": str(name), "step": int(step), "value": number, "time": now})
        with self._lock:
            room = self.max_pending - len(self._pending)
            if room < len(batch):
                self.dropped += len(batch) - max(room, 0)
                batch = batch[:max(room, 0)]
            self._pending.extend(batch)
            full = len(self._pending) >= self.batch_size
        if full:
            self._wake.set()

    # --- Sending -----------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything pending now (in the caller's thread), retrying as the background thread does."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            batch = self._take()
            if not batch:
                return
            self._send(batch, deadline)

    def close(self) -> None:
        """Flush and stop the background thread (also run at interpreter exit)."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)
        self.flush(timeout_s=30)

    def _take(self) -> list[dict[str, Any]]:
        with self._lock:
            batch, self._pending = self._pending[:self.batch_size], self._pending[self.batch_size:]
        return batch

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            while not self._closed:
                batch = self._take()
                if not batch:
                    break
                self._send(batch, None)

    def _send(self, batch: list[dict[str, Any]], deadline: float | None) -> None:
        body: dict[str, Any] = {"points": batch}
        if self.eid is not None:
            body["executionId"] = str(self.eid)
        data = json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            request = urllib.request.Request(self.endpoint, data, method="POST", headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    self.written += int(json.loads(response.read() or b"{}").get("written", 0))
                return
            except urllib.error.HTTPError as exc:
                if exc.code in (400, 401, 403, 404, 413):
                    answer = exc.read()
                    if exc.code == 400 and _refused_time(answer) and any("time" in p for p in batch):
                        # This machine's clock is ahead of the server's by more than it accepts
                        # (XMC_METRICS_MAX_FUTURE_S): send the points again with the server's time.
                        logger.warning("xmc_metrics: the server refused this clock's time (%s); sending with the "
                                       "server's", answer[:300].decode(errors="replace"))
                        self._send([{k: v for k, v in p.items() if k != "time"} for p in batch], deadline)
                        return
                    self.dropped += len(batch)
                    logger.warning("xmc_metrics: %d points refused (HTTP %d): %s", len(batch), exc.code,
                                   answer[:300].decode(errors="replace"))
                    return
                error: Exception = exc
                wait = exc.headers.get("Retry-After", "") if exc.code in (429, 503) else ""
            except (urllib.error.URLError, OSError, ValueError) as exc:
                error = exc
                wait = ""
            if attempt == self.max_retries or (deadline is not None and time.monotonic() > deadline):
                break
            delay = self.backoff_s * (2 ** attempt) * (0.5 + random.random())
            if wait.isdigit():  # the server says when (too many calls a second): no sooner
                delay = max(delay, min(float(wait), 60.0))
            time.sleep(delay)
        self.dropped += len(batch)
        logger.warning("xmc_metrics: %d points not sent after %d tries: %s", len(batch), self.max_retries + 1, error)


class _Noop:
    """What `default_writer` answers when the job was not started by XMC."""

    written = 0
    dropped = 0

    def log(self, step: int, **values: float) -> None:
        pass

    def log_dict(self, step: int, values: Mapping[str, float]) -> None:
        pass

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> None:
        pass

    def flush(self, timeout_s: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


_default: Writer | _Noop | None = None
_default_lock = threading.Lock()


def default_writer() -> Writer | _Noop:
    """The process's writer, built from the environment on first use (a no-op without it)."""
    global _default
    with _default_lock:
        if _default is None:
            env = {name: os.environ.get(name, "") for name in ENV_VARS}
            missing = [name for name in ENV_VARS if not env[name] and name != "XMC_EID"]
            if missing:
                logger.warning("xmc_metrics: %s not set (not started by XMC?); metrics are not sent",
                               ", ".join(missing))
                _default = _Noop()
            else:
                try:
                    xid, wid = int(env["XMC_XID"]), int(env["XMC_WID"])
                    eid = int(env["XMC_EID"]) if env["XMC_EID"] else None
                except ValueError:
                    logger.warning("xmc_metrics: XMC_XID/XMC_WID/XMC_EID are not integers; metrics are not sent")
                    _default = _Noop()
                else:
                    writer = Writer(env["XMC_METRICS_URL"], xid, wid, eid, env["XMC_METRICS_TOKEN"])
                    atexit.register(writer.close)
                    _default = writer
        return _default


def log(step: int, **values: float) -> None:
    """Record ``values`` at ``step`` with the process's writer: ``xmc_metrics.log(10, loss=0.5)``."""
    default_writer().log(step, **values)


def add_scalar(tag: str, scalar_value: float, global_step: int | None = None) -> None:
    """TensorBoard-style: ``xmc_metrics.add_scalar("val/loss", 0.5, 10)``."""
    default_writer().add_scalar(tag, scalar_value, global_step)


def flush(timeout_s: float | None = None) -> None:
    """Send what is pending now."""
    default_writer().flush(timeout_s)
