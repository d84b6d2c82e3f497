"""The only place that turns a work unit into a JobSet manifest.

``build_jobset`` maps every field of ``cloud.xmanager.v1.JobSetExecutable``
(and ``SchedulingConstraints``) to a ``jobset.x-k8s.io/v1alpha2`` JobSet, and
stamps what the rest of the control loop relies on: the identity labels
(``xmc.google.com/xid``, ``wid``, ``execution-id``, ``last-edit``), the
notify-when annotation, our finalizer and ``spec.suspend: true`` with the
Kueue queue label and workload priority class (Kueue un-suspends it on
admission). ``validate_executable`` is the same knowledge turned into
request validation: ``workunits.validation`` (and so CreateWorkUnit) calls it,
and the actuator calls it again before a create, so a manifest the cluster
would refuse is refused with INVALID_ARGUMENT naming the field.

Upstream references: JobSet API
https://github.com/kubernetes-sigs/jobset/blob/main/api/jobset/v1alpha2/jobset_types.go
and its create validation
https://github.com/kubernetes-sigs/jobset/blob/main/pkg/webhooks/jobset_webhook.go;
Kueue's labels
https://github.com/kubernetes-sigs/kueue/blob/main/pkg/controller/constants/constants.go.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from core import pb
from core.errors import InvalidArgument
from k8s_bridge.accelerators import EXCLUSIVE_TOPOLOGY_ANNOTATION, GPU_ACCELERATORS, TPU_ACCELERATORS
from k8s_bridge.client import JOBSET_GROUP, JOBSET_VERSION

LABEL_XID = "xmc.google.com/xid"
LABEL_WID = "xmc.google.com/wid"
LABEL_EID = "xmc.google.com/execution-id"
LABEL_LAST_EDIT = "xmc.google.com/last-edit"
ANNOTATION_NOTIFY_WHEN = "xmc.google.com/notify-when"
FINALIZER = "jobset.xmanager.cloud/finalizer"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
GPU_NODE_SELECTOR = "cloud.google.com/gke-accelerator"
TPU_ACCELERATOR_NODE_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_NODE_SELECTOR = "cloud.google.com/gke-tpu-topology"
GPU_RESOURCE = "nvidia.com/gpu"
TPU_RESOURCE = "google.com/tpu"
GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
#: Kueue WorkloadPriorityClass for each XManager priority (unset: none, the queue's default).
PRIORITY_CLASSES: dict[str, str] = {"LOW": "low", "NORMAL": "medium", "HIGH": "high"}
#: Chips per TPU VM host (GKE multi-host slices place 4 chips on each host).
TPU_CHIPS_PER_HOST = 4

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
TPU_TOPOLOGY = re.compile(r"^\d+(x\d+){0,2}$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
POD_RESTART_POLICIES = frozenset({"Never", "OnFailure"})
DNS_POLICIES = frozenset({"ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"})
#: Length of the random suffix the Job controller adds to pod names ("-abcde").
_POD_SUFFIX = 6


def jobset_name(xid: int, wid: int) -> str:
    """``xmc-<xid>-<wid>``: one name for every execution of a work unit."""
    return f"xmc-{xid}-{wid}"


@dataclass(frozen=True)
class Stamp:
    """What identifies one execution's JobSet (labels, annotation)."""

    xid: int
    wid: int
    eid: int
    last_edit_ns: int
    notify_when: str = ""
    priority: str = ""


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


# --- Building ----------------------------------------------------------------------------


def _quantity_bytes(value: int) -> str:
    return str(int(value))


def _resources(resources: pb.resources.ResourceSet | None) -> tuple[dict[str, Any], dict[str, str]]:
    """(container resources, node selector) for a ResourceSet."""
    if resources is None:
        return {}, {}
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    selector: dict[str, str] = {}
    kind = resources.WhichOneof("resources")
    if kind == "cpu_resources":
        cpu = resources.cpu_resources
        if cpu.cpu_millicores:
            requests["cpu"] = f"{cpu.cpu_millicores}m"
        if cpu.memory_bytes:
            requests["memory"] = _quantity_bytes(cpu.memory_bytes)
        if cpu.limit_cpu_millicores:
            limits["cpu"] = f"{cpu.limit_cpu_millicores}m"
    elif kind == "gpu_resources":
        gpu = resources.gpu_resources
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpu.count)
        selector[GPU_NODE_SELECTOR] = GPU_ACCELERATORS[gpu.type]
    elif kind == "tpu_resources":
        tpu = resources.tpu_resources
        chips = math.prod(int(d) for d in tpu.topology.split("x"))
        per_host = chips if tpu.type.endswith("-device") else min(chips, TPU_CHIPS_PER_HOST)
        requests[TPU_RESOURCE] = limits[TPU_RESOURCE] = str(per_host)
        selector[TPU_ACCELERATOR_NODE_SELECTOR] = tpu.type
        selector[TPU_TOPOLOGY_NODE_SELECTOR] = tpu.topology
    if resources.ephemeral_storage_bytes:
        requests["ephemeral-storage"] = _quantity_bytes(resources.ephemeral_storage_bytes)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out, selector


def _env(spec: pb.work_unit.ExecutableSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": spec.env_vars[k]} for k in sorted(spec.env_vars)]
    for var in spec.env:
        if var.WhichOneof("source") == "value_from":
            ref = var.value_from.WhichOneof("reference")
            if ref == "field_ref":
                field_ref: dict[str, Any] = {"fieldPath": var.value_from.field_ref.field_path}
                if var.value_from.field_ref.api_version:
                    field_ref["apiVersion"] = var.value_from.field_ref.api_version
                env.append({"name": var.name, "valueFrom": {"fieldRef": field_ref}})
            else:
                secret = var.value_from.secret_key_ref
                secret_ref: dict[str, Any] = {"name": secret.name, "key": secret.key}
                if secret.HasField("optional"):
                    secret_ref["optional"] = secret.optional
                env.append({"name": var.name, "valueFrom": {"secretKeyRef": secret_ref}})
        else:
            env.append({"name": var.name, "value": var.value})
    return env


_PROTOCOLS = {0: "TCP", 1: "TCP", 2: "UDP", 3: "SCTP"}


def _container(spec: pb.work_unit.ExecutableSpec, default_name: str) -> tuple[dict[str, Any], dict[str, str]]:
    container: dict[str, Any] = {"name": spec.name or default_name, "image": spec.docker_image}
    if spec.command:
        container["command"] = list(spec.command)
    args = list(spec.args_list) + [f"--{k}={spec.args[k]}" for k in sorted(spec.args)]
    if args:
        container["args"] = args
    env = _env(spec)
    if env:
        container["env"] = env
    resources, selector = _resources(spec.resources if spec.HasField("resources") else None)
    if resources:
        container["resources"] = resources
    if spec.volume_mounts:
        mounts = []
        for mount in spec.volume_mounts:
            m: dict[str, Any] = {"name": mount.name, "mountPath": mount.mount_path}
            if mount.HasField("read_only"):
                m["readOnly"] = mount.read_only
            if mount.sub_path:
                m["subPath"] = mount.sub_path
            mounts.append(m)
        container["volumeMounts"] = mounts
    if spec.ports:
        ports = []
        for port in spec.ports:
            p: dict[str, Any] = {"containerPort": port.container_port, "protocol": _PROTOCOLS[port.protocol]}
            if port.name:
                p["name"] = port.name
            if port.host_port:
                p["hostPort"] = port.host_port
            ports.append(p)
        container["ports"] = ports
    if spec.HasField("privileged"):
        container["securityContext"] = {"privileged": spec.privileged}
    if spec.HasField("restart_policy") and spec.restart_policy:
        container["restartPolicy"] = spec.restart_policy
    return container, selector


def _volume(volume: pb.work_unit.Volume) -> dict[str, Any]:
    out: dict[str, Any] = {"name": volume.name}
    source = volume.WhichOneof("source")
    if source == "persistent_volume_claim":
        pvc: dict[str, Any] = {"claimName": volume.persistent_volume_claim.claim_name}
        if volume.persistent_volume_claim.HasField("read_only"):
            pvc["readOnly"] = volume.persistent_volume_claim.read_only
        out["persistentVolumeClaim"] = pvc
    elif source == "gcs":
        gcs = volume.gcs
        attributes = {"bucketName": gcs.bucket}
        if gcs.mount_options:
            attributes["mountOptions"] = ",".join(gcs.mount_options)
        csi: dict[str, Any] = {"driver": GCSFUSE_DRIVER, "volumeAttributes": attributes}
        if gcs.HasField("read_only"):
            csi["readOnly"] = gcs.read_only
        out["csi"] = csi
    elif source == "host_path":
        host: dict[str, Any] = {"path": volume.host_path.path}
        if volume.host_path.type:
            host["type"] = volume.host_path.type
        out["hostPath"] = host
    elif source == "empty_dir":
        empty: dict[str, Any] = {}
        if volume.empty_dir.medium:
            empty["medium"] = volume.empty_dir.medium
        if volume.empty_dir.size_limit_bytes:
            empty["sizeLimit"] = _quantity_bytes(volume.empty_dir.size_limit_bytes)
        out["emptyDir"] = empty
    elif source == "secret":
        secret: dict[str, Any] = {"secretName": volume.secret.secret_name}
        if volume.secret.HasField("default_mode"):
            secret["defaultMode"] = volume.secret.default_mode
        if volume.secret.HasField("optional"):
            secret["optional"] = volume.secret.optional
        out["secret"] = secret
    elif source == "config_map":
        config_map: dict[str, Any] = {"name": volume.config_map.name}
        if volume.config_map.HasField("default_mode"):
            config_map["defaultMode"] = volume.config_map.default_mode
        if volume.config_map.HasField("optional"):
            config_map["optional"] = volume.config_map.optional
        out["configMap"] = config_map
    elif source == "nfs":
        nfs: dict[str, Any] = {"server": volume.nfs.server, "path": volume.nfs.path}
        if volume.nfs.HasField("read_only"):
            nfs["readOnly"] = volume.nfs.read_only
        out["nfs"] = nfs
    return out


_DEPENDENCY_STATUS = {0: "Complete", 1: "Ready", 2: "Complete"}


def _replicated_job(job: pb.work_unit.KubernetesJob, jobset_exe: pb.work_unit.JobSetExecutable) -> dict[str, Any]:
    main, selector = _container(job.spec, job.name)
    pod_spec: dict[str, Any] = {}
    init: list[dict[str, Any]] = []
    for spec in job.init_containers:
        container, extra = _container(spec, spec.name)
        init.append(container)
        selector.update(extra)
    for spec in job.sidecars:
        # Native sidecars (KEP-753): init containers that keep running.
        container, extra = _container(spec, spec.name)
        container["restartPolicy"] = "Always"
        init.append(container)
        selector.update(extra)
    if init:
        pod_spec["initContainers"] = init
    pod_spec["containers"] = [main]
    restart_policy = job.restart_policy if job.HasField("restart_policy") else "Never"
    pod_spec["restartPolicy"] = restart_policy
    node_selector = {**selector, **dict(job.node_selector)}
    if node_selector:
        pod_spec["nodeSelector"] = dict(sorted(node_selector.items()))
    if job.service_account:
        pod_spec["serviceAccountName"] = job.service_account
    if job.priority_class_name:
        pod_spec["priorityClassName"] = job.priority_class_name
    if job.volumes:
        pod_spec["volumes"] = [_volume(v) for v in job.volumes]
    if job.HasField("host_network"):
        pod_spec["hostNetwork"] = job.host_network
    if job.HasField("dns_policy"):
        pod_spec["dnsPolicy"] = job.dns_policy
    elif job.HasField("host_network") and job.host_network:
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if job.HasField("termination_grace_period_seconds"):
        pod_spec["terminationGracePeriodSeconds"] = job.termination_grace_period_seconds

    pod_annotations = dict(job.annotations)
    if any(v.WhichOneof("source") == "gcs" for v in job.volumes):
        pod_annotations.setdefault(GCSFUSE_ANNOTATION, "true")
    pod_metadata: dict[str, Any] = {}
    if job.labels:
        pod_metadata["labels"] = dict(job.labels)
    if pod_annotations:
        pod_metadata["annotations"] = pod_annotations

    job_spec: dict[str, Any] = {
        # JobSet defaults Indexed; an Indexed Job needs completions, so say it.
        "completionMode": "Indexed",
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": job.retry_limit if job.retry_limit else job.replicas * 5,
        "template": {"metadata": pod_metadata, "spec": pod_spec},
    }
    if job.active_deadline_seconds:
        job_spec["activeDeadlineSeconds"] = job.active_deadline_seconds
    disable_pfp = job.HasField("disable_pod_failure_policy") and job.disable_pod_failure_policy
    if not disable_pfp and restart_policy == "Never":
        # A preempted or evicted pod is not the program's failure: do not count it.
        job_spec["podFailurePolicy"] = {
            "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
        }
    rjob: dict[str, Any] = {"name": job.name, "replicas": job.replicas, "template": {"spec": job_spec}}
    if job.group_name:
        rjob["groupName"] = job.group_name
    if job.dependency_order.job_name:
        rjob["dependsOn"] = [{
            "name": job.dependency_order.job_name,
            "status": _DEPENDENCY_STATUS[job.dependency_order.job_dependency_state],
        }]
    return rjob


def build_jobset(executable: pb.work_unit.Executable, stamp: Stamp, *, namespace: str) -> dict[str, Any]:
    """The JobSet manifest for one execution (validated first: raises InvalidArgument)."""
    name = jobset_name(stamp.xid, stamp.wid)
    validate_executable(executable)
    validate_names(executable, name)
    exe = executable.jobset
    labels = dict(exe.labels)
    labels.update({
        LABEL_XID: str(stamp.xid),
        LABEL_WID: str(stamp.wid),
        LABEL_EID: str(stamp.eid),
        LABEL_LAST_EDIT: str(stamp.last_edit_ns),
    })
    queue = executable.scheduling_constraints.queue_name
    if queue:
        labels[QUEUE_LABEL] = queue
    if stamp.priority in PRIORITY_CLASSES:
        labels[PRIORITY_CLASS_LABEL] = PRIORITY_CLASSES[stamp.priority]
    annotations = dict(exe.annotations)
    if stamp.notify_when:
        annotations[ANNOTATION_NOTIFY_WHEN] = stamp.notify_when
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels, "finalizers": [FINALIZER]}
    if annotations:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {
        "suspend": True,
        "replicatedJobs": [_replicated_job(job, exe) for job in exe.jobs],
    }
    if exe.HasField("network"):
        network: dict[str, Any] = {}
        if exe.network.HasField("enable_dns_hostnames"):
            network["enableDNSHostnames"] = exe.network.enable_dns_hostnames
        if exe.network.subdomain:
            network["subdomain"] = exe.network.subdomain
        if exe.network.HasField("publish_not_ready_addresses"):
            network["publishNotReadyAddresses"] = exe.network.publish_not_ready_addresses
        if network:
            spec["network"] = network
    if exe.HasField("success_policy"):
        operator = "Any" if exe.success_policy.operator == pb.work_unit.JobSetExecutable.SuccessPolicy.ANY else "All"
        policy: dict[str, Any] = {"operator": operator}
        if exe.success_policy.target_replicated_jobs:
            policy["targetReplicatedJobs"] = list(exe.success_policy.target_replicated_jobs)
        spec["successPolicy"] = policy
    if exe.HasField("coordinator"):
        coordinator: dict[str, Any] = {"replicatedJob": exe.coordinator.replicated_job}
        if exe.coordinator.HasField("job_index"):
            coordinator["jobIndex"] = exe.coordinator.job_index
        if exe.coordinator.HasField("pod_index"):
            coordinator["podIndex"] = exe.coordinator.pod_index
        spec["coordinator"] = coordinator
    return {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": metadata,
        "spec": spec,
    }


def identity(jobset: dict[str, Any]) -> tuple[int | None, int | None, int | None, int | None]:
    """(xid, wid, eid, last_edit_ns) read from a JobSet's labels (None when absent or garbled)."""
    labels = (jobset.get("metadata") or {}).get("labels") or {}

    def number(key: str) -> int | None:
        try:
            return int(labels[key])
        except (KeyError, TypeError, ValueError):
            return None

    return number(LABEL_XID), number(LABEL_WID), number(LABEL_EID), number(LABEL_LAST_EDIT)
