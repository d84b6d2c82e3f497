"""Two resumption runs at once, and a run killed mid-way (real Postgres, real Redis, a real process)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection

from k8s_bridge.actuator.pause import hold_if_paused, release
from tests import factories
from tests.workunits.scheduling.conftest import OLIVIA, actuator_messages, task_for
from tests.childenv import child_database_url
from workunits import outbox, resumption, scheduling
from workunits.models import PausedTask

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.django_db(transaction=True)


def held_work_units(n: int) -> None:
    exp = factories.experiment()
    scheduling.pause(reason="upgrade", by=OLIVIA)
    for _ in range(n):
        assert hold_if_paused(task_for(factories.work_unit(exp), "CREATE"))
        release()
    scheduling.resume(by=OLIVIA, dispatch=False)


def test_it_processes_every_row_exactly_once_with_two_runs_at_once(broker, monkeypatch) -> None:
    held_work_units(60)
    real_publish = outbox.publish

    def slow_publish(task) -> None:  # the broker round trip, long enough for the runs to overlap
        time.sleep(0.005)
        real_publish(task)

    monkeypatch.setattr("workunits.outbox.publish", slow_publish)
    summaries: list[resumption.RunSummary] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def one_run() -> None:
        try:
            start.wait(30)
            summaries.append(resumption.run(uuid.uuid4(), batch_size=4))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one_run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sum(s.resumed for s in summaries) == 60
    assert all(s.resumed > 0 for s in summaries), "both runs took rows"
    run_ids = {s.run_id for s in summaries}
    rows = list(PausedTask.objects.values_list("resolution_status", "resumption_run_id"))
    assert len(rows) == 60 and all(status == "RESUMED" and run in run_ids for status, run in rows)
    sent = [task.wid for _, task in actuator_messages(broker)]
    assert sorted(sent) == list(range(1, 61))  # each sent once


KILLED_RUN = textwrap.dedent("""
    import sys, time, uuid
    import django
    django.setup()
    from workunits import outbox, resumption
    real = outbox.publish
    def slow(task):
        time.sleep(0.02)
        real(task)
    outbox.publish = slow
    print("started", flush=True)
    resumption.run(uuid.UUID(sys.argv[1]), batch_size=5)
""")


def test_it_leaves_the_rest_to_the_next_run_when_a_run_is_killed(broker, tmp_path) -> None:
    held_work_units(80)
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "xmc.settings", "PYTHONPATH": str(ROOT),
           "DATABASE_URL": child_database_url()}
    killed_run = uuid.uuid4()
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN)
    proc = subprocess.Popen([sys.executable, str(script), str(killed_run)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while PausedTask.objects.filter(resumption_run_id=killed_run).count() < 10:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    done_by_killed = PausedTask.objects.filter(resumption_run_id=killed_run).count()
    left = PausedTask.objects.filter(processed_time__isnull=True).count()
    assert done_by_killed % 5 == 0, "only whole batches commit"
    assert 10 <= done_by_killed < 80 and done_by_killed + left == 80
    next_run = resumption.run(uuid.uuid4(), batch_size=7)  # the dead run's row locks died with it
    assert next_run.resumed == left
    assert PausedTask.objects.filter(processed_time__isnull=True).count() == 0
    assert set(PausedTask.objects.values_list("resumption_run_id", flat=True)) == {killed_run, next_run.run_id}
    # At least once: every work unit was sent; only the killed, uncommitted batch may go twice
    # (the actuator is idempotent for a Create whose JobSet exists).
    sent = [task.wid for _, task in actuator_messages(broker)]
    assert set(sent) == set(range(1, 81)) and len(sent) - 80 <= 5
