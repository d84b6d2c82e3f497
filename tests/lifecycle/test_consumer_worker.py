"""The lifecycle consumer through a real Celery worker process on the test Redis and Postgres.

The reconciler and the actuator are other issues: the test plays the
reconciler by committing real transitions (``update_work_unit_executions``)
and calling the hooks with JobSetContext values, and the worker does the
rest against the MachineLearningRun emulator.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from artifacts import xprof
from lifecycle import hooks
from lifecycle.hooks import JobSetContext
from simulators.mlrun import EmulatorHandle
from tests import waiting
from tests.celery_workers import CeleryWorkers
from tests.lifecycle import brokers
from tests.lifecycle.conftest import CLUSTER, LOCATION, PROJECT, execution, running_work_unit, set_state, \
    xprof_artifact
from workunits import hooks as workunit_hooks
from workunits import services as wu_services
from workunits.models import WorkUnit

pytestmark = pytest.mark.django_db(transaction=True)
ALL = "STARTING.RUNNING.STOPPED.COMPLETED.FAILED"


@pytest.fixture
def worker(lifecycle_on: Any, emulator: EmulatorHandle, celery_workers: CeleryWorkers) -> Iterator[Path]:
    """A `celery -A xmc worker -Q lifecycle` child (tests/celery_workers.py); its log's path."""
    brokers.purge("lifecycle")
    proc = celery_workers.start("lifecycle", env={
        "XMC_ARTIFACT_LIFECYCLE_ENABLED": "true",
        "XMC_MLRUN_ENDPOINT": emulator.url,
        "XMC_MLRUN_PROJECT": PROJECT,
        "XMC_MLRUN_LOCATION": LOCATION,
        "XMC_MLRUN_TOKEN": "test-token",
        "XMC_GKE_CLUSTER": CLUSTER,
    })
    try:
        yield celery_workers.log_path(proc)
    finally:
        celery_workers.stop(proc)
        brokers.purge("lifecycle")


def eventually(check: Callable[[], Any], log: Path, what: str, timeout: float = 120.0) -> Any:
    """`tests.waiting.eventually`, with the worker's log tail when it times out."""
    return waiting.eventually(check, timeout, what, interval=0.2,
                              detail=lambda: f"worker log:\n{log.read_text()[-4000:]}")


def context(wu: WorkUnit, notify_when: str = ALL) -> JobSetContext:
    wu.refresh_from_db()
    return JobSetContext(xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid, namespace="default",
                         name=f"xmc-{wu.experiment_id}-{wu.wid}", uid=f"uid-{wu.experiment_id}-{wu.current_eid}",
                         creation_time=datetime(2026, 11, 30, tzinfo=timezone.utc), notify_when=notify_when)


def ctx(wu: WorkUnit) -> dict[tuple[int, int, int], JobSetContext]:
    c = context(wu)
    return {(c.xid, c.wid, c.eid): c}


def phase(emulator: EmulatorHandle, wu: WorkUnit, eid: int) -> str:
    run = emulator.emulator.run_by_id(xprof.mlrun_id(wu.experiment_id, wu.wid, eid))
    return str(run["runPhase"]) if run else ""


def test_it_runs_a_work_unit_to_completed_restarts_it_and_survives_service_errors(
    worker: Path, emulator: EmulatorHandle
) -> None:
    wu = running_work_unit()
    artifact = xprof_artifact(wu)
    assert workunit_hooks.notify_when_for(wu.experiment_id, wu.wid) == ALL  # what the Create task stamps

    hooks.on_transitions_committed(set_state(wu, "RUNNING"), ctx(wu))
    eventually(lambda: phase(emulator, wu, 1) == "ACTIVE", worker, "run 1 ACTIVE")
    url1 = xprof.console_url(PROJECT, LOCATION, xprof.mlrun_id(wu.experiment_id, wu.wid, 1))

    def persisted() -> bool:
        artifact.refresh_from_db()
        return bool(artifact.payload["managedXprof"].get("xprof", {}).get("xprofUrl") == url1)

    eventually(persisted, worker, "xprof_url persisted")
    eventually(lambda: execution(wu, 1).metadata.get("mlrunUrl") == url1, worker, "mlrun_url on the execution")

    # The service fails twice: the event is retried with backoff until it succeeds.
    emulator.inject(method="GET", status="UNAVAILABLE", times=2)
    hooks.on_transitions_committed(set_state(wu, "COMPLETED"), ctx(wu))
    eventually(lambda: phase(emulator, wu, 1) == "COMPLETED", worker, "run 1 COMPLETED after retries")
    assert "Retry in" in worker.read_text()

    # Restart: the superseded execution's run is closed, eid 2 gets its own.
    wu2 = running_work_unit(title="second")
    xprof_artifact(wu2)
    hooks.on_transitions_committed(set_state(wu2, "RUNNING"), ctx(wu2))
    eventually(lambda: phase(emulator, wu2, 1) == "ACTIVE", worker, "wu2 run 1 ACTIVE")
    wu_services.restart_work_units(wu2.experiment_id, [wu2.wid], batch=False)  # hook enqueues the close
    eventually(lambda: phase(emulator, wu2, 1) == "FAILED", worker, "superseded run closed")
    hooks.on_transitions_committed(set_state(wu2, "RUNNING"), ctx(wu2))
    eventually(lambda: phase(emulator, wu2, 2) == "ACTIVE", worker, "run 2 ACTIVE")


def test_it_drops_a_malformed_event_without_retrying(worker: Path) -> None:
    from xmc.celery import Queue, app

    sent = app.send_task("xmc.lifecycle.handle_event", args=["not base64!"], queue=Queue.LIFECYCLE.value)
    eventually(lambda: "lifecycle.event.malformed" in worker.read_text() or "malformed" in worker.read_text(),
               worker, "the malformed event logged")
    # The task's own end line (xmc.task), instead of a fixed second: it ended, and not in a retry.
    ended = f"task=xmc.lifecycle.handle_event task_id={sent.id} state="
    eventually(lambda: ended in worker.read_text(), worker, "the task's end logged")
    assert f"{ended}SUCCESS" in worker.read_text()
    assert "Retry in" not in worker.read_text()


def test_it_creates_the_run_after_a_late_attach_patches_notify_when(
    worker: Path, emulator: EmulatorHandle, delivered: list[list[int]]
) -> None:
    from workunits import outbox
    from workunits.models import Operation

    wu = running_work_unit(title="attach")
    hooks.on_transitions_committed(set_state(wu, "RUNNING"), {(wu.experiment_id, wu.wid, 1): context(wu, "")})
    hooks.on_jobset_observed(context(wu, ""), "RUNNING")  # no artifact yet: no annotation
    delivered.clear()
    xprof_artifact(wu)  # commits; the Update operation goes to the outbox after commit
    op = Operation.objects.select_related("work_unit").get(work_unit=wu, action_type="UPDATE")
    assert delivered == [[op.id]]
    task = outbox.build_task(op)
    assert task.notify_when == ALL
    # The actuator patched the annotation; the reconciler sees it newly added.
    hooks.on_jobset_observed(context(wu, task.notify_when), "RUNNING")
    eventually(lambda: phase(emulator, wu, 1) == "ACTIVE", worker, "run created after the late attach")
    assert emulator.emulator.run_by_id(xprof.mlrun_id(wu.experiment_id, wu.wid, 1)) is not None
