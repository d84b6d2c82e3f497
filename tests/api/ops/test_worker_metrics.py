"""A Celery worker serves Prometheus metrics for the tasks its pool ran, and the delivery gauge."""
from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from tests.celery_workers import CeleryWorkers
from xmc.celery import app
from tests.ports import free_port

QUEUE = "xmc-metrics-test"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


@pytest.mark.timeout(180)
@pytest.mark.django_db
def test_it_counts_the_tasks_of_every_pool_process(celery_workers: CeleryWorkers, tmp_path: Path) -> None:
    port = free_port()
    worker = celery_workers.start(QUEUE, pool="prefork", concurrency=2, env={
        "XMC_WORKER_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "XMC_LOG_FORMAT": "json"})
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
    celery_workers.stop(worker)
    # One structured line per task.
    out = celery_workers.log(worker)
    assert out.count('"event": "celery.task"') >= 3, out[-3000:]
