"""The only place that turns a work unit into a JobSet manifest.

``build_jobset`` maps every field of ``cloud.xmanager.v1.JobSetExecutable``
(and ``SchedulingConstraints``) to a ``jobset.x-k8s.io/v1alpha2`` JobSet, and
stamps what the rest of the control loop relies on: the identity labels
(``xmc.google.com/xid``, ``wid``, ``execution-id``, ``last-edit``), the
notify-when annotation, our finalizer and ``spec.suspend: true`` with the
Kueue queue label and workload priority class (Kueue un-suspends it on
admission). The same knowledge turned into request validation is
``jobsets.validation.validate_executable``: CreateWorkUnit calls it, and
``build_jobset`` calls it again, so a manifest the cluster would refuse is
refused with INVALID_ARGUMENT naming the field. The names, labels and
annotation it stamps are the contract in ``jobsets.contract``.

Upstream references: JobSet API
https://github.com/kubernetes-sigs/jobset/blob/main/api/jobset/v1alpha2/jobset_types.go
and its create validation
https://github.com/kubernetes-sigs/jobset/blob/main/pkg/webhooks/jobset_webhook.go;
Kueue's labels
https://github.com/kubernetes-sigs/kueue/blob/main/pkg/controller/constants/constants.go.
"""
from __future__ import annotations

import math
from typing import Any

from core import pb
from jobsets.accelerators import GPU_ACCELERATORS
from jobsets.contract import (
    ANNOTATION_NOTIFY_WHEN,
    FINALIZER,
    JOBSET_GROUP,
    JOBSET_VERSION,
    LABEL_EID,
    LABEL_LAST_EDIT,
    LABEL_WID,
    LABEL_XID,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    Stamp,
    jobset_name,
)
from jobsets.validation import validate_executable, validate_names

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


def _add_env(replicated_jobs: list[dict[str, Any]], extra: tuple[tuple[str, str], ...]) -> None:
    """Give every container (init and sidecar containers too) ``extra``, replacing same-named variables."""
    names = {name for name, _ in extra}
    for rjob in replicated_jobs:
        pod_spec = rjob["template"]["spec"]["template"]["spec"]
        for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
            env = [var for var in container.get("env", []) if var["name"] not in names]
            env.extend({"name": name, "value": value} for name, value in extra)
            container["env"] = env


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
    if stamp.env:
        _add_env(spec["replicatedJobs"], stamp.env)
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
