"""A Celery worker serves Prometheus metrics for the tasks its pool ran, and the delivery gauge."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.childenv import child_database_url
from xmc.celery import app
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
QUEUE = "xmc-metrics-test"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


@pytest.mark.timeout(180)
@pytest.mark.django_db
def test_it_counts_the_tasks_of_every_pool_process(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "XMC_WORKER_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
           "XMC_LOG_FORMAT": "json", "DATABASE_URL": child_database_url()}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "xmc", "worker", "-Q", QUEUE, "--concurrency", "2",
         "--without-heartbeat", "--without-gossip", "--without-mingle", "--hostname", f"metrics-{port}@%h"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for _ in range(3):
            app.send_task("xmc.ping", queue=QUEUE)
        deadline = time.monotonic() + 120
        text = ""
        while time.monotonic() < deadline:
            try:
                text = _scrape(port)
            except OSError:
                text = ""
            if 'xmc_celery_tasks_total{state="SUCCESS",task="xmc.ping"} 3.0' in text:
                break
            time.sleep(0.5)
        assert 'xmc_celery_tasks_total{state="SUCCESS",task="xmc.ping"} 3.0' in text, text[-2000:]
        assert 'xmc_celery_task_duration_seconds_count{task="xmc.ping"} 3.0' in text
        # The delivery gauge, read from the database at the scrape (the rows are the truth).
        assert 'xmc_delivery_oldest_pending_seconds{queue="actuator"} 0.0' in text
        assert 'xmc_delivery_oldest_pending_seconds{queue="notifications"} 0.0' in text
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            out, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            out, _ = worker.communicate()
    # One structured line per task.
    assert out.count('"event": "celery.task"') >= 3, out[-3000:]
