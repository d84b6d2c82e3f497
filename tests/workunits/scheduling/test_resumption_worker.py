"""A resume from the admin/REST path runs on a real Celery worker consuming the ``resumption`` queue."""
from __future__ import annotations

import subprocess
import time

import pytest

from k8s_bridge.actuator.pause import hold_if_paused, release
from tests import factories
from tests.workunits.scheduling.conftest import OLIVIA, actuator_messages, task_for
from tests.celery_workers import CeleryWorkers
from workunits import scheduling
from workunits.models import PausedTask


@pytest.fixture
def resumption_worker(celery_workers: CeleryWorkers) -> subprocess.Popen[bytes]:
    return celery_workers.start("resumption")


@pytest.mark.django_db(transaction=True)
def test_it_runs_a_dispatched_resumption_on_the_resumption_queue(broker, resumption_worker, celery_workers) -> None:
    exp = factories.experiment()
    scheduling.pause(reason="upgrade", by=OLIVIA)
    for _ in range(4):
        assert hold_if_paused(task_for(factories.work_unit(exp), "CREATE"))
        release()
    result = scheduling.resume(by=OLIVIA, batch_size=3)  # dispatched after commit
    deadline = time.monotonic() + 180
    while PausedTask.objects.filter(resumption_run_id=result.run_id).count() < 4:
        assert resumption_worker.poll() is None, celery_workers.logs()
        assert time.monotonic() < deadline, celery_workers.logs()
        time.sleep(0.2)
    assert set(PausedTask.objects.values_list("resolution_status", flat=True)) == {"RESUMED"}
    assert sorted(t.wid for _, t in actuator_messages(broker)) == [1, 2, 3, 4]
