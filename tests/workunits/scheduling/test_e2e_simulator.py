"""End to end on the simulator: pause, work arrives, resume; the right JobSets appear, once.

Real processes against the simulator (speed 20): a Celery worker on the
``actuator`` and ``resumption`` queues (the real ``outbox.deliver_committed``), the
reconciler command (it observes RUNNING and removes the finalizer so a
Restart's delete completes), and the artifact lifecycle on for the
notify-when Update task (no lifecycle worker: nothing calls MLRun).

The story (issue 12): pause; create three work units, restart a running
one, attach an artifact that needs a notify-when patch (to a running one);
stop one of the paused ones; resume. Then: the two remaining new work units
and the restarted one have their JobSets (the restarted at execution 2), the
running one is patched, the stopped one never reached the cluster, and
nothing ran twice (one JobSet per work unit, never re-created, nothing left
to send, a second resume sends nothing).
"""
from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from artifacts import services as artifact_services
from simulators.cluster.server import SimulatorHandle
from tests import factories, waiting
from tests.workunits.scheduling.conftest import OLIVIA, broker  # noqa: F401 - fixture: this run's Redis, emptied
from tests.celery_workers import ROOT, CeleryWorkers, worker_env
from workunits import resumption, scheduling, services
from workunits.models import PausedTask, WorkUnit, WorkUnitExecution
from workunits.outbox import deliver as REAL_DELIVER  # both captured before the autouse fixture stubs them
from core import pb
from workunits.outbox import deliver_committed as REAL_DELIVER_COMMITTED

NAMESPACE = "default"
SIMULATOR_SPEED = 20  # `simulator`'s (tests/fixtures/simulators.py)
EXECUTION_LABEL = "xmc.google.com/execution-id"
NOTIFY_WHEN = "xmc.google.com/notify-when"
#: Pods that keep running for the whole story (the simulator runs at speed 20,
#: so its default 10 s script would complete the "running" work unit at once).
LONG: dict[str, Any] = {"annotations": {"sim.xmc.dev/script": "pull=1s;run=100000s;exit=0"}}


def eventually(predicate: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    return waiting.eventually(predicate, timeout, what, interval=0.25)


#: The artifact lifecycle on (the notify-when patch needs ManagedXprofRule), which
#: needs the MachineLearningRun project and location. No lifecycle worker runs
#: here, so nothing calls the endpoint (a closed loopback port).
LIFECYCLE = {"XMC_ARTIFACT_LIFECYCLE_ENABLED": "true", "XMC_MLRUN_PROJECT": "xmc-test",
             "XMC_MLRUN_LOCATION": "us-central1", "XMC_MLRUN_ENDPOINT": "http://127.0.0.1:9",
             "XMC_MLRUN_TOKEN": "unused"}


def _env(simulator: SimulatorHandle) -> dict[str, str]:
    return {"REDIS_URL": settings.CELERY_BROKER_URL, "KUBECONFIG": str(simulator.kubeconfig_path),
            "XMC_K8S_NAMESPACE": NAMESPACE, **LIFECYCLE}


@pytest.fixture
def control_plane(simulator: SimulatorHandle, broker: Any, tmp_path: Path, celery_workers: CeleryWorkers,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real worker (actuator + resumption queues) and the reconciler, against the simulator."""
    monkeypatch.setattr("workunits.outbox.deliver_committed", REAL_DELIVER_COMMITTED)
    monkeypatch.setattr("workunits.outbox.deliver", REAL_DELIVER)
    for name, value in LIFECYCLE.items():
        monkeypatch.setattr(settings, name, True if value == "true" else value)
    celery_workers.start("actuator,resumption", pool="threads", concurrency=4, env=_env(simulator))
    with (tmp_path / "reconciler.log").open("w") as log:
        reconciler = subprocess.Popen([sys.executable, "manage.py", "reconcile", "--namespace", NAMESPACE,
                                       "--metrics-port", "0"],
                                      cwd=ROOT, env=worker_env(_env(simulator)), stdout=log, stderr=subprocess.STDOUT)
    yield
    reconciler.send_signal(signal.SIGTERM)
    celery_workers.stop_all()
    try:
        reconciler.wait(30)
    except subprocess.TimeoutExpired:
        reconciler.kill()
        reconciler.wait(30)


def jobsets(simulator: SimulatorHandle) -> dict[str, dict[str, Any]]:
    items = simulator.store.list("jobsets", NAMESPACE)[0]
    return {js["metadata"]["name"]: js for js in items}


def jobset_of(simulator: SimulatorHandle, wu: WorkUnit) -> dict[str, Any] | None:
    return jobsets(simulator).get(f"xmc-{wu.experiment_id}-{wu.wid}")


def state_of(wu: WorkUnit) -> str:
    wu.refresh_from_db()
    return WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid).state


@pytest.mark.django_db(transaction=True)
def test_it_resumes_exactly_the_right_work_after_a_pause(simulator: SimulatorHandle, control_plane: None,
                                                         broker: Any) -> None:  # noqa: F811
    def quiet() -> None:
        """Only the worker writes JobSets: wait until it has handled every task sent so far (its queues
        empty, nothing taken and unfinished; tasks are acked at their end), not a fixed 2 s."""
        eventually(lambda: broker.llen("actuator") == broker.llen("resumption") == broker.hlen("unacked") == 0,
                   "the worker's queues drained")

    exp = factories.experiment()
    running, to_restart = factories.work_unit(exp, **LONG), factories.work_unit(exp, **LONG)
    for wu in (running, to_restart):
        eventually(lambda wu=wu: state_of(wu) == "RUNNING", f"{wu.name} RUNNING")
    created_uid = {wu.wid: jobset_of(simulator, wu)["metadata"]["uid"] for wu in (running, to_restart)}

    scheduling.pause(reason="cluster upgrade", by=OLIVIA)
    fresh = [factories.work_unit(exp, **LONG) for _ in range(3)]
    services.restart_work_units(exp.id, [to_restart.wid], batch=False)
    # A managed-XProf artifact: ManagedXprofRule wants state notifications, so the
    # lifecycle sends an Update task patching notify-when (held while paused).
    artifact_services.create_artifact(exp.id, running.wid, pb.artifact.Artifact(
        payload=pb.artifact.ArtifactPayload(managed_xprof=pb.artifact.ManagedXprofArtifact(
            display_name="profile"))))
    eventually(lambda: PausedTask.objects.filter(processed_time__isnull=True).count() == 5,
               "3 Creates, 1 Restart and 1 Update held")
    for wu in [*fresh, to_restart]:
        eventually(lambda wu=wu: state_of(wu) == "SCHEDULING_PAUSED", f"{wu.name} SCHEDULING_PAUSED")
    stopped = fresh[0]
    services.stop_work_units(exp.id, [stopped.wid], batch=False)
    assert state_of(stopped) == "STOPPED"
    quiet()  # the paused world stays still: nothing new on the cluster
    assert set(jobsets(simulator)) == {f"xmc-{exp.id}-{running.wid}", f"xmc-{exp.id}-{to_restart.wid}"}
    assert jobset_of(simulator, to_restart)["metadata"]["labels"][EXECUTION_LABEL] == "1"

    result = scheduling.resume(by=OLIVIA)  # dispatched to the resumption queue
    eventually(lambda: not PausedTask.objects.filter(processed_time__isnull=True).exists(), "the run to finish")
    rows = {(r.task_type, r.wid): (r.resolution_status, r.skip_reason) for r in PausedTask.objects.all()}
    assert rows[("CREATE", stopped.wid)] == ("SKIPPED", "work_unit_stopped")
    assert rows[("RESTART", to_restart.wid)] == ("RESUMED", "")
    assert rows[("UPDATE", running.wid)] == ("RESUMED", "")
    assert all(rows[("CREATE", wu.wid)] == ("RESUMED", "") for wu in fresh[1:])
    assert set(PausedTask.objects.values_list("resumption_run_id", flat=True)) == {result.run_id}

    for wu in fresh[1:]:
        eventually(lambda wu=wu: state_of(wu) == "RUNNING", f"{wu.name} RUNNING after resume")
    eventually(lambda: (jobset_of(simulator, to_restart) or {}).get("metadata", {}).get("labels", {})
               .get(EXECUTION_LABEL) == "2", "the restarted JobSet at execution 2")
    eventually(lambda: jobset_of(simulator, running)["metadata"].get("annotations", {}).get(NOTIFY_WHEN),
               "the notify-when patch on the running JobSet")
    assert jobset_of(simulator, stopped) is None, "the stopped work unit never reached the cluster"
    assert state_of(stopped) == "STOPPED"

    # Nothing ran twice: one JobSet per work unit, the running one never re-created,
    # and a second resume finds nothing to send.
    names = {f"xmc-{exp.id}-{wu.wid}" for wu in [running, to_restart, *fresh[1:]]}
    assert set(jobsets(simulator)) == names
    assert jobset_of(simulator, running)["metadata"]["uid"] == created_uid[running.wid]
    again = resumption.run(scheduling.resume(by=OLIVIA, dispatch=False).run_id, batch_size=10)
    assert (again.resumed, again.skipped) == (0, 0)
    uids = {name: js["metadata"]["uid"] for name, js in jobsets(simulator).items()}
    quiet()
    assert {name: js["metadata"]["uid"] for name, js in jobsets(simulator).items()} == uids
