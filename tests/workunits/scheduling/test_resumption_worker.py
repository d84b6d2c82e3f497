"""A resume from the admin/REST path runs on a real Celery worker consuming the ``resumption`` queue."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from k8s_bridge.actuator.pause import hold_if_paused, release
from tests import factories
from tests.workunits.scheduling.conftest import OLIVIA, actuator_messages, task_for
from tests.childenv import child_database_url
from workunits import scheduling
from workunits.models import PausedTask

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def resumption_worker(tmp_path):
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "xmc.settings", "PYTHONPATH": str(ROOT),
           "DATABASE_URL": child_database_url(),
           "CELERY_BROKER_URL": settings.CELERY_BROKER_URL}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "xmc", "worker", "-Q", "resumption", "--pool", "solo",
         "--without-heartbeat", "--without-gossip", "--without-mingle", "-n", f"resume-test-{os.getpid()}@%h"],
        cwd=ROOT, env=env, stdout=(tmp_path / "worker.log").open("w"), stderr=subprocess.STDOUT)
    yield proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


@pytest.mark.django_db(transaction=True)
def test_it_runs_a_dispatched_resumption_on_the_resumption_queue(broker, resumption_worker, tmp_path) -> None:
    exp = factories.experiment()
    scheduling.pause(reason="upgrade", by=OLIVIA)
    for _ in range(4):
        assert hold_if_paused(task_for(factories.work_unit(exp), "CREATE"))
        release()
    result = scheduling.resume(by=OLIVIA, batch_size=3)  # dispatched after commit
    deadline = time.monotonic() + 180
    while PausedTask.objects.filter(resumption_run_id=result.run_id).count() < 4:
        assert resumption_worker.poll() is None, (tmp_path / "worker.log").read_text()
        assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
        time.sleep(0.2)
    assert set(PausedTask.objects.values_list("resolution_status", flat=True)) == {"RESUMED"}
    assert sorted(t.wid for _, t in actuator_messages(broker)) == [1, 2, 3, 4]
