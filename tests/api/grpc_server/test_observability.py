"""The gRPC server counts and times every call (Prometheus) and logs one line per call."""
from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from core.pb import api
from tests.api.grpc_server.conftest import metadata_for
from tests.ports import free_port

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]
ESS_NAME = "cloud.xmanager.v1.ExperimentStateService"


def _count(method: str, code: str) -> float:
    value = REGISTRY.get_sample_value(
        "xmc_rpc_requests_total", {"transport": "grpc", "service": ESS_NAME, "method": method, "code": code})
    return value or 0.0


def test_it_counts_each_call_by_method_and_code_and_logs_it(
    ess: Any, fresh_email: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    me = metadata_for(fresh_email("obs"))
    ok_before = _count("CreateExperiment", "OK")
    denied_before = _count("GetExperiment", "PERMISSION_DENIED")
    with caplog.at_level(logging.INFO, logger="xmc.api.grpc_server"):
        ess.CreateExperiment(api.CreateExperimentRequest(), metadata=me)
        with pytest.raises(grpc.RpcError):
            ess.GetExperiment(api.GetExperimentRequest(name="experiments/987654321"), metadata=me)
    assert _count("CreateExperiment", "OK") == ok_before + 1
    assert _count("GetExperiment", "PERMISSION_DENIED") == denied_before + 1
    lines = [r for r in caplog.records if r.getMessage() == "grpc.rpc"]
    assert [(r.method, r.code) for r in lines][-2:] == [  # type: ignore[attr-defined]
        (f"/{ESS_NAME}/CreateExperiment", "OK"), (f"/{ESS_NAME}/GetExperiment", "PERMISSION_DENIED")]
    assert all(r.duration_ms >= 0 for r in lines)  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_it_serves_metrics_on_a_port_when_asked() -> None:
    metrics = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "grpcserver", "--port", "0", "--host", "127.0.0.1",
         "--metrics-port", str(metrics)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=2) as response:
                    body = response.read().decode()
                break
            except OSError:
                time.sleep(0.3)
        assert "xmc_rpc_duration_seconds" in body
    finally:
        server.terminate()
        server.wait(timeout=30)
