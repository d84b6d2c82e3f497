"""Validation of a WorkUnit's Executable before anything is written.

Called by ``workunits.services.create_work_unit`` (and so by every API).
Each problem raises ``InvalidArgument`` naming the field path, e.g.
``work_unit.executable.jobset.jobs[1].name``.
"""
from __future__ import annotations

import re

from k8s_bridge.accelerators import EXCLUSIVE_TOPOLOGY_ANNOTATION, GPU_ACCELERATORS, TPU_ACCELERATORS
from xmc import limits, pb
from xmc.errors import InvalidArgument

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
TPU_TOPOLOGY = re.compile(r"^\d+(x\d+){0,2}$")


def _fail(field: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{field}: {message}", field=field)


def validate_resources(resources: pb.resources.ResourceSet, field: str) -> None:
    kind = resources.WhichOneof("resources")
    if kind == "cpu_resources":
        cpu = resources.cpu_resources
        if cpu.cpu_millicores < 0 or cpu.memory_bytes < 0 or cpu.limit_cpu_millicores < 0:
            raise _fail(f"{field}.cpu_resources", "values must not be negative")
        if cpu.cpu_millicores > 0 and cpu.memory_bytes <= 0:
            raise _fail(f"{field}.cpu_resources.memory_bytes", "a CPU request needs memory_bytes > 0")
        if cpu.limit_cpu_millicores and cpu.limit_cpu_millicores < cpu.cpu_millicores:
            raise _fail(f"{field}.cpu_resources.limit_cpu_millicores", "limit is below the request")
    elif kind == "gpu_resources":
        gpu = resources.gpu_resources
        if gpu.type not in GPU_ACCELERATORS:
            raise _fail(
                f"{field}.gpu_resources.type",
                f"unknown GPU type {gpu.type!r}; known: {', '.join(sorted(GPU_ACCELERATORS))}",
            )
        if gpu.count < 1:
            raise _fail(f"{field}.gpu_resources.count", "must be at least 1")
    elif kind == "tpu_resources":
        tpu = resources.tpu_resources
        if tpu.type not in TPU_ACCELERATORS:
            raise _fail(
                f"{field}.tpu_resources.type",
                f"unknown TPU type {tpu.type!r}; known: {', '.join(sorted(TPU_ACCELERATORS))}",
            )
        if not TPU_TOPOLOGY.match(tpu.topology):
            raise _fail(f"{field}.tpu_resources.topology", f"{tpu.topology!r} is not a topology like 2x4")
    if resources.ephemeral_storage_bytes < 0:
        raise _fail(f"{field}.ephemeral_storage_bytes", "must not be negative")


def validate_executable(executable: pb.work_unit.Executable, field: str = "work_unit.executable") -> None:
    if executable.WhichOneof("type") != "jobset":
        raise _fail(f"{field}.jobset", "an executable needs a jobset")
    jobset = executable.jobset
    if not jobset.jobs:
        raise _fail(f"{field}.jobset.jobs", "an executable needs at least one job")
    names: set[str] = set()
    for i, job in enumerate(jobset.jobs):
        jf = f"{field}.jobset.jobs[{i}]"
        if not DNS1123_LABEL.match(job.name) or len(job.name) > 63:
            raise _fail(f"{jf}.name", f"{job.name!r} is not a DNS-1123 label (lower-case letters, digits, '-')")
        if job.name in names:
            raise _fail(f"{jf}.name", f"duplicate job name {job.name!r}")
        names.add(job.name)
        if job.replicas < 1:
            raise _fail(f"{jf}.replicas", f"must be at least 1 (got {job.replicas})")
        if job.retry_limit < 0:
            raise _fail(f"{jf}.retry_limit", "must not be negative")
        if job.active_deadline_seconds < 0:
            raise _fail(f"{jf}.active_deadline_seconds", "must not be negative")
        if not job.spec.docker_image:
            raise _fail(f"{jf}.spec.docker_image", "an image is required")
        if job.spec.HasField("resources"):
            validate_resources(job.spec.resources, f"{jf}.spec.resources")
        exclusive = EXCLUSIVE_TOPOLOGY_ANNOTATION in job.annotations or EXCLUSIVE_TOPOLOGY_ANNOTATION in jobset.annotations
        if job.HasField("host_network") and job.host_network and not exclusive:
            raise _fail(
                f"{jf}.host_network",
                f"host_network needs the {EXCLUSIVE_TOPOLOGY_ANNOTATION} annotation (job or jobset annotations)",
            )
    for i, job in enumerate(jobset.jobs):
        dep = job.dependency_order
        if dep.job_name:
            if dep.job_name not in names or dep.job_name == job.name:
                raise _fail(
                    f"{field}.jobset.jobs[{i}].dependency_order.job_name",
                    f"{dep.job_name!r} is not another job of this executable",
                )
    if jobset.HasField("success_policy"):
        for target in jobset.success_policy.target_replicated_jobs:
            if target not in names:
                raise _fail(f"{field}.jobset.success_policy.target_replicated_jobs", f"unknown job {target!r}")


def validate_work_unit_request(message: pb.work_unit.WorkUnit, work_unit_id: int) -> None:
    """CreateWorkUnit's own fields: the explicit id's range, tags and notes (``xmc.limits``)."""
    if work_unit_id < 0:
        raise InvalidArgument("work_unit_id must not be negative", field="work_unit_id")
    if work_unit_id > limits.MAX_WORK_UNIT_ID:
        raise InvalidArgument(
            f"work_unit_id must be at most {limits.MAX_WORK_UNIT_ID} (got {work_unit_id})", field="work_unit_id"
        )
    limits.check_fields({"tags": list(message.tags), "notes": message.notes}, "work_unit")
