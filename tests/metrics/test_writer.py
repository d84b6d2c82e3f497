"""The shipped writer (``clients/python/src/xmc_metrics``) against a live server, as a job would use it."""
from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metrics import tokens
from metrics.models import MetricPoint
from tests import factories
from tests.metrics.conftest import experiment_for, stored_summaries, summaries_from_points
from workunits.models import WorkUnit

SRC = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"
sys.path.insert(0, str(SRC))
import xmc_metrics  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unit() -> WorkUnit:
    return factories.work_unit(experiment_for("alice@example.com"), wid=1)


def _env(live_server: Any, unit: WorkUnit) -> dict[str, str]:
    return {"XMC_METRICS_URL": live_server.url, "XMC_XID": str(unit.experiment_id), "XMC_WID": "1", "XMC_EID": "1",
            "XMC_METRICS_TOKEN": tokens.token_for(unit.experiment_id, 1, 1)}


def test_it_batches_and_sends_logged_values_and_scalars(live_server: Any, unit: WorkUnit) -> None:
    env = _env(live_server, unit)
    writer = xmc_metrics.Writer(env["XMC_METRICS_URL"], unit.experiment_id, 1, 1, env["XMC_METRICS_TOKEN"],
                                batch_size=4, flush_interval_s=60)
    for step in range(10):
        writer.log(step, loss=1.0 / (step + 1), acc=step / 10)
    writer.add_scalar("val/loss", 0.5, 3)
    writer.log_dict(4, {"val/loss": 0.25})
    writer.log(11, loss=float("nan"))  # not finite: not sent
    writer.close()
    assert writer.written == 22 and writer.dropped == 0
    assert MetricPoint.objects.count() == 22
    assert sorted(MetricPoint.objects.filter(metric="val/loss").values_list("step", "value")) == [(3, 0.5), (4, 0.25)]
    summaries = stored_summaries()
    assert summaries == summaries_from_points() and summaries[unit.pk, 1, "loss"][:2] == (0.1, 9)


class _Flaky(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []
    bodies: list[Any] = []
    times: list[float] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        type(self).times.append(time.monotonic())
        code = type(self).answers.pop(0) if type(self).answers else 200
        self.send_response(code)
        if code == 429:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(json.dumps({"written": 1}).encode() if code == 200 else b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.mark.django_db(transaction=False)
def test_it_retries_with_backoff_and_drops_what_the_server_refuses(flaky: str, caplog: Any) -> None:
    _Flaky.answers, _Flaky.bodies = [503, 502], []
    writer = xmc_metrics.Writer(flaky, 1, 1, 2, "t", flush_interval_s=60, backoff_s=0.01)
    writer.log(1, loss=0.5)
    writer.flush()
    assert len(_Flaky.bodies) == 3 and _Flaky.bodies[0] == _Flaky.bodies[2]  # the same batch, retried
    assert _Flaky.bodies[0] == {"points": [{"metric": "loss", "step": 1, "value": 0.5,
                                            "time": _Flaky.bodies[0]["points"][0]["time"]}], "executionId": "2"}
    assert writer.written == 1
    _Flaky.answers = [400]
    writer.log(2, loss=0.5)
    with caplog.at_level(logging.WARNING, logger="xmc_metrics"):
        writer.close()
    assert writer.dropped == 1 and "refused (HTTP 400)" in caplog.text


@pytest.mark.django_db(transaction=False)
def test_it_retries_a_429_no_sooner_than_its_retry_after(flaky: str) -> None:
    _Flaky.answers, _Flaky.bodies, _Flaky.times = [429], [], []
    writer = xmc_metrics.Writer(flaky, 1, 1, 2, "t", flush_interval_s=60, backoff_s=0.01)
    writer.log(1, loss=0.5)
    writer.flush()
    assert len(_Flaky.bodies) == 2 and _Flaky.bodies[0] == _Flaky.bodies[1] and writer.written == 1
    assert _Flaky.times[1] - _Flaky.times[0] >= 1.0  # the server's Retry-After, not the 10 ms backoff
    writer.close()


@pytest.mark.django_db(transaction=False)
def test_it_is_a_no_op_with_a_warning_without_the_environment(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    for name in xmc_metrics.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(xmc_metrics, "_default", None)
    with caplog.at_level(logging.WARNING, logger="xmc_metrics"):
        xmc_metrics.log(1, loss=0.5)
        xmc_metrics.add_scalar("x", 1.0, 2)
        xmc_metrics.flush()
    assert "XMC_METRICS_URL" in caplog.text and caplog.text.count("not sent") == 1


def test_it_flushes_at_exit_in_a_job_process(live_server: Any, unit: WorkUnit) -> None:
    script = "import xmc_metrics\nfor s in range(5):\n    xmc_metrics.log(s, loss=s * 0.1)\n"
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, **_env(live_server, unit),
                                                               "PYTHONPATH": str(SRC)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(MetricPoint.objects.values_list("step", flat=True)) == [0, 1, 2, 3, 4]
