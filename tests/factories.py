"""Small builders for test data; they go through the real services."""
from __future__ import annotations

from typing import Any

from core import pb
from experiments import services as experiment_services
from experiments.models import Experiment
from tests.fixtures.people import ALICE as ALICE  # the cast's emails, re-exported for the builders' callers
from tests.fixtures.people import BOB as BOB
from workunits import services as wu_services
from workunits.models import WorkUnit



def executable(**job_kw: Any) -> pb.work_unit.Executable:
    job = pb.work_unit.KubernetesJob(
        name=job_kw.pop("name", "trainer"),
        replicas=job_kw.pop("replicas", 1),
        spec=pb.work_unit.ExecutableSpec(
            docker_image="gcr.io/proj/trainer:v1",
            resources=pb.resources.ResourceSet(
                cpu_resources=pb.resources.CpuResources(cpu_millicores=2000, memory_bytes=4 << 30)
            ),
        ),
        **job_kw,
    )
    return pb.work_unit.Executable(
        scheduling_constraints=pb.work_unit.SchedulingConstraints(queue_name="cpu-queue"),
        jobset=pb.work_unit.JobSetExecutable(jobs=[job]),
    )


def work_unit_message(**job_kw: Any) -> pb.work_unit.WorkUnit:
    return pb.work_unit.WorkUnit(executable=executable(**job_kw))


def experiment(creator: str = ALICE, **kw: Any) -> Experiment:
    return experiment_services.create_experiment(pb.experiment.Experiment(**kw), creator=creator)


def work_unit(exp: Experiment, wid: int = 0, **job_kw: Any) -> WorkUnit:
    op = wu_services.create_work_unit(exp.id, work_unit_message(**job_kw), work_unit_id=wid)
    return WorkUnit.objects.get(id=op.work_unit_id)
