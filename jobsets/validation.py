"""Validation of a WorkUnit's Executable (and CreateWorkUnit's own fields) before anything is written.

Called by ``workunits.services.create_work_unit`` (and so by every API), and
again by ``jobsets.builder.build_jobset`` before a manifest is built. The rules
live beside the manifest they protect: one owner, so a work unit the API
accepts is always one the actuator can turn into a JobSet the cluster accepts.
Pure: it imports neither the Kubernetes SDK nor an app. Each problem raises ``InvalidArgument`` naming the field
path, e.g. ``work_unit.executable.jobset.jobs[1].name``.
"""
from __future__ import annotations

import re

from core import limits, pb
from core.errors import InvalidArgument
from jobsets.accelerators import EXCLUSIVE_TOPOLOGY_ANNOTATION, GPU_ACCELERATORS, TPU_ACCELERATORS

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
TPU_TOPOLOGY = re.compile(r"^\d+(x\d+){0,2}$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
POD_RESTART_POLICIES = frozenset({"Never", "OnFailure"})
DNS_POLICIES = frozenset({"ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"})
#: Length of the random suffix the Job controller adds to pod names ("-abcde").
_POD_SUFFIX = 6


def validate_work_unit_request(message: pb.work_unit.WorkUnit, work_unit_id: int) -> None:
    """CreateWorkUnit's own fields: the explicit id's range, tags and notes (``core.limits``)."""
    if work_unit_id < 0:
        raise InvalidArgument("work_unit_id must not be negative", field="work_unit_id")
    if work_unit_id > limits.MAX_WORK_UNIT_ID:
        raise InvalidArgument(
            f"work_unit_id must be at most {limits.MAX_WORK_UNIT_ID} (got {work_unit_id})", field="work_unit_id"
        )
    limits.check_fields({"tags": list(message.tags), "notes": message.notes}, "work_unit")


def _fail(field: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{field}: {message}", field=field)


# --- Validation --------------------------------------------------------------------------


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


def _validate_spec(spec: pb.work_unit.ExecutableSpec, field: str, volumes: set[str], *, sidecar: bool) -> None:
    if not spec.docker_image:
        raise _fail(f"{field}.docker_image", "an image is required")
    if spec.name and (not DNS1123_LABEL.match(spec.name) or len(spec.name) > 63):
        raise _fail(f"{field}.name", f"{spec.name!r} is not a DNS-1123 label")
    if spec.HasField("resources"):
        validate_resources(spec.resources, f"{field}.resources")
    for key in spec.env_vars:
        if not ENV_NAME.match(key):
            raise _fail(f"{field}.env_vars", f"{key!r} is not a valid environment variable name")
    for i, env in enumerate(spec.env):
        if not ENV_NAME.match(env.name):
            raise _fail(f"{field}.env[{i}].name", f"{env.name!r} is not a valid environment variable name")
        if env.WhichOneof("source") == "value_from":
            ref = env.value_from.WhichOneof("reference")
            if ref is None:
                raise _fail(f"{field}.env[{i}].value_from", "needs field_ref or secret_key_ref")
            if ref == "field_ref" and not env.value_from.field_ref.field_path:
                raise _fail(f"{field}.env[{i}].value_from.field_ref.field_path", "is required")
            if ref == "secret_key_ref" and not (env.value_from.secret_key_ref.name and env.value_from.secret_key_ref.key):
                raise _fail(f"{field}.env[{i}].value_from.secret_key_ref", "needs name and key")
    for i, mount in enumerate(spec.volume_mounts):
        if mount.name not in volumes:
            raise _fail(f"{field}.volume_mounts[{i}].name", f"no volume named {mount.name!r} in this job")
        if not mount.mount_path.startswith("/"):
            raise _fail(f"{field}.volume_mounts[{i}].mount_path", "must be an absolute path")
    for i, port in enumerate(spec.ports):
        if not 0 < port.container_port < 65536:
            raise _fail(f"{field}.ports[{i}].container_port", "must be in 1..65535")
        if port.host_port and not 0 < port.host_port < 65536:
            raise _fail(f"{field}.ports[{i}].host_port", "must be in 1..65535")
        if port.name and (len(port.name) > 15 or not DNS1123_LABEL.match(port.name)):
            raise _fail(f"{field}.ports[{i}].name", f"{port.name!r} is not an IANA service name (≤15, lower-case)")
    if spec.HasField("restart_policy"):
        allowed = {"Always"} if sidecar else {"Always", ""}
        if spec.restart_policy not in allowed:
            raise _fail(f"{field}.restart_policy", "a container restart policy can only be 'Always' (sidecars)")


def _validate_volume(volume: pb.work_unit.Volume, field: str) -> None:
    if not DNS1123_LABEL.match(volume.name) or len(volume.name) > 63:
        raise _fail(f"{field}.name", f"{volume.name!r} is not a DNS-1123 label")
    source = volume.WhichOneof("source")
    if source is None:
        raise _fail(f"{field}.source", "a volume needs a source (pvc, gcs, host_path, empty_dir, secret, config_map, nfs)")
    required = {
        "persistent_volume_claim": ("claim_name",), "gcs": ("bucket",), "host_path": ("path",),
        "secret": ("secret_name",), "config_map": ("name",), "nfs": ("server", "path"),
    }
    message = getattr(volume, source)
    for name in required.get(source, ()):
        if not getattr(message, name):
            raise _fail(f"{field}.{source}.{name}", "is required")
    if source == "empty_dir" and volume.empty_dir.size_limit_bytes < 0:
        raise _fail(f"{field}.empty_dir.size_limit_bytes", "must not be negative")


def validate_executable(executable: pb.work_unit.Executable, field: str = "work_unit.executable") -> None:
    """Refuse (INVALID_ARGUMENT naming the field) what the cluster would refuse."""
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
        volume_names: set[str] = set()
        for v, volume in enumerate(job.volumes):
            _validate_volume(volume, f"{jf}.volumes[{v}]")
            if volume.name in volume_names:
                raise _fail(f"{jf}.volumes[{v}].name", f"duplicate volume name {volume.name!r}")
            volume_names.add(volume.name)
        _validate_spec(job.spec, f"{jf}.spec", volume_names, sidecar=False)
        container_names = {job.spec.name or job.name}
        for kind in ("sidecars", "init_containers"):
            for s, spec in enumerate(getattr(job, kind)):
                sf = f"{jf}.{kind}[{s}]"
                _validate_spec(spec, sf, volume_names, sidecar=kind == "sidecars")
                if not spec.name:
                    raise _fail(f"{sf}.name", "sidecars and init containers need a name")
                if spec.name in container_names:
                    raise _fail(f"{sf}.name", f"duplicate container name {spec.name!r}")
                container_names.add(spec.name)
        exclusive = EXCLUSIVE_TOPOLOGY_ANNOTATION in job.annotations or EXCLUSIVE_TOPOLOGY_ANNOTATION in jobset.annotations
        if job.HasField("host_network") and job.host_network and not exclusive:
            raise _fail(
                f"{jf}.host_network",
                f"host_network needs the {EXCLUSIVE_TOPOLOGY_ANNOTATION} annotation (job or jobset annotations)",
            )
        if job.HasField("restart_policy") and job.restart_policy not in POD_RESTART_POLICIES:
            raise _fail(f"{jf}.restart_policy", f"must be one of {', '.join(sorted(POD_RESTART_POLICIES))} for a Job")
        if job.HasField("dns_policy") and job.dns_policy not in DNS_POLICIES:
            raise _fail(f"{jf}.dns_policy", f"must be one of {', '.join(sorted(DNS_POLICIES))}")
        if job.HasField("termination_grace_period_seconds") and job.termination_grace_period_seconds < 0:
            raise _fail(f"{jf}.termination_grace_period_seconds", "must not be negative")
        if job.group_name and (not DNS1123_LABEL.match(job.group_name) or len(job.group_name) > 63):
            raise _fail(f"{jf}.group_name", f"{job.group_name!r} is not a DNS-1123 label")
    for i, job in enumerate(jobset.jobs):
        dep = job.dependency_order
        if dep.job_name:
            if dep.job_name not in names or dep.job_name == job.name:
                raise _fail(
                    f"{field}.jobset.jobs[{i}].dependency_order.job_name",
                    f"{dep.job_name!r} is not another job of this executable",
                )
            if i == 0:
                raise _fail(f"{field}.jobset.jobs[0].dependency_order", "the first job cannot depend on another (JobSet dependsOn)")
    if jobset.HasField("success_policy"):
        for target in jobset.success_policy.target_replicated_jobs:
            if target not in names:
                raise _fail(f"{field}.jobset.success_policy.target_replicated_jobs", f"unknown job {target!r}")
    if jobset.HasField("coordinator"):
        coordinator = jobset.coordinator
        by_name = {job.name: job for job in jobset.jobs}
        if coordinator.replicated_job not in by_name:
            raise _fail(f"{field}.jobset.coordinator.replicated_job", f"unknown job {coordinator.replicated_job!r}")
        if not 0 <= coordinator.job_index < by_name[coordinator.replicated_job].replicas:
            raise _fail(f"{field}.jobset.coordinator.job_index", "must be below the job's replicas")
        if coordinator.HasField("pod_index") and coordinator.pod_index < 0:
            raise _fail(f"{field}.jobset.coordinator.pod_index", "must not be negative")
    if jobset.network.subdomain and (not DNS1123_LABEL.match(jobset.network.subdomain) or len(jobset.network.subdomain) > 63):
        raise _fail(f"{field}.jobset.network.subdomain", f"{jobset.network.subdomain!r} is not a DNS-1123 label")
    queue = executable.scheduling_constraints.queue_name
    if queue and (not DNS1123_LABEL.match(queue) or len(queue) > 63):
        raise _fail(f"{field}.scheduling_constraints.queue_name", f"{queue!r} is not a DNS-1123 label")


def validate_names(executable: pb.work_unit.Executable, name: str, field: str = "work_unit.executable") -> None:
    """Pod hostnames ``<jobset>-<job>-<jobIndex>-<podIndex>`` (+ the Job controller's
    5-character suffix) must stay a 63-character DNS label (JobSet create validation)."""
    for i, job in enumerate(executable.jobset.jobs):
        longest = len(f"{name}-{job.name}-{max(0, job.replicas - 1)}-0") + _POD_SUFFIX
        if longest > 63:
            raise _fail(f"{field}.jobset.jobs[{i}].name",
                        f"{job.name!r} makes pod names of {name} {longest} characters long (limit 63)")
