"""A real Prometheus (Debian's package) scraping a test simulator every second, for the system metrics tests.

Started with the same configuration ``./dev run`` generates (scripts/prometheus.py),
its own port and data folder; `RealPrometheus.wait_for` polls its query API with a
deadline until a series is there (no fixed sleeps).
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from scripts import prometheus as prometheus_setup
from tests.ports import free_port
from tests.waiting import eventually

SCRAPE_S = 1.0


@dataclass
class RealPrometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        body = requests.post(f"{self.url}/api/v1/query", data={"query": promql}, timeout=10).json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for(self, promql: str, *, timeout: float = 60.0, what: str = "") -> list[dict[str, Any]]:
        return eventually(lambda: self.query(promql), timeout, what or f"Prometheus to have {promql}",
                          interval=0.2, retry_on=(requests.RequestException,),
                          detail=lambda: self.log.read_text(errors="replace")[-2000:])


def start_prometheus(simulator_url: str, folder: Path, *, scrape_s: float = SCRAPE_S) -> Iterator[RealPrometheus]:
    """A generator for a fixture: the running Prometheus, stopped (SIGTERM, then SIGKILL) afterwards."""
    executable = prometheus_setup.binary()
    if executable is None:
        pytest.skip("no prometheus on PATH (apt-get install prometheus; ./dev test installs it)")
    config = folder / "prometheus.yml"
    config.write_text(prometheus_setup.config_text(simulator_url, scrape_interval_s=scrape_s))
    port = free_port()
    log = folder / "prometheus.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(prometheus_setup.argv(executable, config, folder / "data", port), stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = RealPrometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        def ready() -> bool:
            assert process.poll() is None, log.read_text(errors="replace")
            return requests.get(f"{server.url}/-/ready", timeout=2).status_code == 200

        eventually(ready, 60, "Prometheus ready", interval=0.2, retry_on=(requests.RequestException,))
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
