"""Work units whose executions run, are preempted, restart and finish at chosen times (the real write path)."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from core import pb
from experiments.models import Experiment
from tests import factories
from workunits import services as wu_services
from workunits import state as guards
from workunits.models import WorkUnit

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=timezone.utc)


def hours(n: float) -> datetime:
    return T0 + timedelta(hours=n)


def gpu_unit(exp: Experiment, gpus: int = 8, replicas: int = 1, queue: str = "gpu-queue",
             cpu_millicores: int = 0) -> WorkUnit:
    job = pb.work_unit.KubernetesJob(
        name="trainer", replicas=replicas,
        spec=pb.work_unit.ExecutableSpec(docker_image="gcr.io/proj/trainer:v1", resources=pb.resources.ResourceSet(
            gpu_resources=pb.resources.GpuResources(type="A100", count=gpus))))
    if cpu_millicores:
        job.sidecars.append(pb.work_unit.ExecutableSpec(
            name="feeder", docker_image="gcr.io/proj/feeder:v1", resources=pb.resources.ResourceSet(
                cpu_resources=pb.resources.CpuResources(cpu_millicores=cpu_millicores, memory_bytes=1 << 30))))
    exe = pb.work_unit.Executable(scheduling_constraints=pb.work_unit.SchedulingConstraints(queue_name=queue),
                                  jobset=pb.work_unit.JobSetExecutable(jobs=[job]))
    op = wu_services.create_work_unit(exp.id, pb.work_unit.WorkUnit(executable=exe))
    return WorkUnit.objects.get(id=op.work_unit_id)


def cpu_unit(exp: Experiment) -> WorkUnit:
    """One replica of 2 CPUs (`tests.factories.executable`), in cpu-queue."""
    return factories.work_unit(exp)


def move(unit: WorkUnit, state: str, at: datetime) -> None:
    """The reconciler's write of ``state``, recorded by the server at ``at``.

    The observation's own time is the wall clock (later than the work unit's creation, as the
    guards want); the history row, which usage reads, carries ``at``.
    """
    unit.refresh_from_db()
    ns = time.time_ns()
    wu_services.update_work_unit_executions([guards.ExecutionUpdate(
        xid=unit.experiment_id, wid=unit.wid, eid=unit.current_eid, mask=("status.state",), state=state,
        state_update_time_ns=ns)], now=at)


def run(unit: WorkUnit, start: datetime, end: datetime | None = None, final: str = "COMPLETED") -> None:
    move(unit, "SCHEDULING", start - timedelta(minutes=5))
    move(unit, "RUNNING", start)
    if end is not None:
        move(unit, final, end)
