"""Golden tests of the JobSet builder: one per Executable field and per accelerator.

Each case builds a manifest, compares the part the field maps to with the
expected JSON written out here, and has the simulator accept it (created
through the real client, then ``kubectl apply --dry-run=server``).
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from core import pb
from core.errors import InvalidArgument
from jobsets.accelerators import EXCLUSIVE_TOPOLOGY_ANNOTATION, GPU_ACCELERATORS
from jobsets.builder import build_jobset
from jobsets.contract import FINALIZER, Stamp
from jobsets.validation import validate_executable
from k8s_bridge import client

W = pb.work_unit
R = pb.resources
_wid = itertools.count(1)


def base() -> W.Executable:
    return W.Executable(
        scheduling_constraints=W.SchedulingConstraints(queue_name="cpu-queue"),
        jobset=W.JobSetExecutable(jobs=[W.KubernetesJob(
            name="trainer", replicas=1, spec=W.ExecutableSpec(docker_image="gcr.io/p/trainer:v1"),
        )]),
    )


def job(exe: W.Executable, i: int = 0) -> W.KubernetesJob:
    return exe.jobset.jobs[i]


def rjob(m: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return m["spec"]["replicatedJobs"][i]


def pod(m: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return rjob(m, i)["template"]["spec"]["template"]


def main(m: dict[str, Any]) -> dict[str, Any]:
    return pod(m)["spec"]["containers"][0]


def _second_job(exe: W.Executable) -> W.KubernetesJob:
    second = exe.jobset.jobs.add()
    second.name = "worker"
    second.replicas = 2
    second.spec.docker_image = "gcr.io/p/worker:v1"
    return second


def _env(exe: W.Executable) -> None:
    spec = job(exe).spec
    spec.env_vars["B"] = "2"
    spec.env_vars["A"] = "1"
    spec.env.add(name="PLAIN", value="x")
    spec.env.add(name="POD", value_from=W.EnvVarSource(field_ref=W.FieldRef(field_path="metadata.name")))
    spec.env.add(name="TOKEN", value_from=W.EnvVarSource(
        secret_key_ref=W.SecretKeyRef(name="creds", key="token", optional=True)))


def _volumes(exe: W.Executable) -> None:
    j = job(exe)
    j.volumes.add(name="data", persistent_volume_claim=W.PersistentVolumeClaimVolumeSource(claim_name="pvc", read_only=True))
    j.volumes.add(name="bucket", gcs=W.GcsVolumeSource(bucket="b", mount_options=["implicit-dirs", "uid=1"], read_only=False))
    j.volumes.add(name="host", host_path=W.HostPathVolumeSource(path="/mnt", type="Directory"))
    j.volumes.add(name="scratch", empty_dir=W.EmptyDirVolumeSource(medium="Memory", size_limit_bytes=1 << 30))
    j.volumes.add(name="sec", secret=W.SecretVolumeSource(secret_name="s", default_mode=0o400, optional=False))
    j.volumes.add(name="cfg", config_map=W.ConfigMapVolumeSource(name="c", default_mode=0o644))
    j.volumes.add(name="share", nfs=W.NfsVolumeSource(server="10.0.0.2", path="/export", read_only=True))
    j.spec.volume_mounts.add(name="data", mount_path="/data", read_only=True, sub_path="x")
    j.spec.volume_mounts.add(name="scratch", mount_path="/scratch")


def _sidecars(exe: W.Executable) -> None:
    j = job(exe)
    j.init_containers.add(name="fetch", docker_image="busybox", command=["sh", "-c", "true"])
    j.sidecars.add(name="proxy", docker_image="envoy:1", args_list=["--port=9000"])


#: (case, how to change the base executable, what to read from the manifest, expected)
CASES: list[tuple[str, Callable[[W.Executable], Any], Callable[[dict[str, Any]], Any], Any]] = [
    ("job.name+replicas", lambda e: setattr(job(e), "replicas", 3),
     lambda m: (rjob(m)["name"], rjob(m)["replicas"]), ("trainer", 3)),
    ("spec.docker_image", lambda e: None, lambda m: main(m)["image"], "gcr.io/p/trainer:v1"),
    ("spec.name", lambda e: setattr(job(e).spec, "name", "main"), lambda m: main(m)["name"], "main"),
    ("spec.command", lambda e: job(e).spec.command.extend(["python", "-m", "train"]),
     lambda m: main(m)["command"], ["python", "-m", "train"]),
    ("spec.args+args_list", lambda e: (job(e).spec.args_list.extend(["pos"]), job(e).spec.args.update({"lr": "0.1", "b": "x y"})),
     lambda m: main(m)["args"], ["pos", "--b=x y", "--lr=0.1"]),
    ("spec.env_vars+env", _env, lambda m: main(m)["env"], [
        {"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "PLAIN", "value": "x"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token", "optional": True}}},
    ]),
    ("spec.resources.cpu", lambda e: job(e).spec.resources.CopyFrom(R.ResourceSet(
        cpu_resources=R.CpuResources(cpu_millicores=1500, memory_bytes=2 << 30, limit_cpu_millicores=3000),
        ephemeral_storage_bytes=10 << 30)),
     lambda m: main(m)["resources"],
     {"requests": {"cpu": "1500m", "memory": str(2 << 30), "ephemeral-storage": str(10 << 30)}, "limits": {"cpu": "3000m"}}),
    ("spec.ports", lambda e: job(e).spec.ports.add(name="grpc", container_port=8470, protocol=W.ContainerPort.UDP, host_port=8470),
     lambda m: main(m)["ports"], [{"containerPort": 8470, "protocol": "UDP", "name": "grpc", "hostPort": 8470}]),
    ("spec.privileged", lambda e: setattr(job(e).spec, "privileged", True),
     lambda m: main(m)["securityContext"], {"privileged": True}),
    ("volumes+volume_mounts", _volumes, lambda m: (pod(m)["spec"]["volumes"], main(m)["volumeMounts"],
                                                  pod(m)["metadata"]["annotations"]), ([
        {"name": "data", "persistentVolumeClaim": {"claimName": "pvc", "readOnly": True}},
        {"name": "bucket", "csi": {"driver": "gcsfuse.csi.storage.gke.io", "readOnly": False,
                                   "volumeAttributes": {"bucketName": "b", "mountOptions": "implicit-dirs,uid=1"}}},
        {"name": "host", "hostPath": {"path": "/mnt", "type": "Directory"}},
        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": str(1 << 30)}},
        {"name": "sec", "secret": {"secretName": "s", "defaultMode": 0o400, "optional": False}},
        {"name": "cfg", "configMap": {"name": "c", "defaultMode": 0o644}},
        {"name": "share", "nfs": {"server": "10.0.0.2", "path": "/export", "readOnly": True}},
    ], [{"name": "data", "mountPath": "/data", "readOnly": True, "subPath": "x"}, {"name": "scratch", "mountPath": "/scratch"}],
        {"gke-gcsfuse/volumes": "true"})),
    ("sidecars+init_containers", _sidecars, lambda m: pod(m)["spec"]["initContainers"], [
        {"name": "fetch", "image": "busybox", "command": ["sh", "-c", "true"]},
        {"name": "proxy", "image": "envoy:1", "args": ["--port=9000"], "restartPolicy": "Always"},
    ]),
    ("retry_limit", lambda e: setattr(job(e), "retry_limit", 7), lambda m: rjob(m)["template"]["spec"]["backoffLimit"], 7),
    ("retry_limit default", lambda e: setattr(job(e), "replicas", 2),
     lambda m: rjob(m)["template"]["spec"]["backoffLimit"], 10),
    ("active_deadline_seconds", lambda e: setattr(job(e), "active_deadline_seconds", 3600),
     lambda m: rjob(m)["template"]["spec"]["activeDeadlineSeconds"], 3600),
    ("indexed completions", lambda e: None, lambda m: {k: rjob(m)["template"]["spec"][k] for k in
                                                    ("completionMode", "completions", "parallelism")},
     {"completionMode": "Indexed", "completions": 1, "parallelism": 1}),
    ("dependency_order", lambda e: _second_job(e).dependency_order.CopyFrom(W.KubernetesJob.DependencyOrder(
        job_name="trainer", job_dependency_state=W.KubernetesJob.DependencyOrder.READY)),
     lambda m: rjob(m, 1)["dependsOn"], [{"name": "trainer", "status": "Ready"}]),
    ("service_account", lambda e: setattr(job(e), "service_account", "trainer-sa"),
     lambda m: pod(m)["spec"]["serviceAccountName"], "trainer-sa"),
    ("node_selector", lambda e: job(e).node_selector.update({"pool": "a"}), lambda m: pod(m)["spec"]["nodeSelector"], {"pool": "a"}),
    ("priority_class_name", lambda e: setattr(job(e), "priority_class_name", "high"),
     lambda m: pod(m)["spec"]["priorityClassName"], "high"),
    ("host_network", lambda e: (setattr(job(e), "host_network", True), job(e).annotations.update({EXCLUSIVE_TOPOLOGY_ANNOTATION: "cloud.google.com/gke-nodepool"})),
     lambda m: (pod(m)["spec"]["hostNetwork"], pod(m)["spec"]["dnsPolicy"]), (True, "ClusterFirstWithHostNet")),
    ("dns_policy", lambda e: setattr(job(e), "dns_policy", "Default"), lambda m: pod(m)["spec"]["dnsPolicy"], "Default"),
    ("group_name", lambda e: setattr(job(e), "group_name", "pool-a"), lambda m: rjob(m)["groupName"], "pool-a"),
    ("job annotations+labels", lambda e: (job(e).annotations.update({"sim.xmc.dev/script": "run=1s;exit=0"}), job(e).labels.update({"team": "x"})),
     lambda m: pod(m)["metadata"], {"annotations": {"sim.xmc.dev/script": "run=1s;exit=0"}, "labels": {"team": "x"}}),
    ("restart_policy", lambda e: setattr(job(e), "restart_policy", "OnFailure"),
     lambda m: (pod(m)["spec"]["restartPolicy"], "podFailurePolicy" in rjob(m)["template"]["spec"]), ("OnFailure", False)),
    ("termination_grace_period_seconds", lambda e: setattr(job(e), "termination_grace_period_seconds", 5),
     lambda m: pod(m)["spec"]["terminationGracePeriodSeconds"], 5),
    ("pod failure policy default", lambda e: None, lambda m: rjob(m)["template"]["spec"]["podFailurePolicy"],
     {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}),
    ("disable_pod_failure_policy", lambda e: setattr(job(e), "disable_pod_failure_policy", True),
     lambda m: "podFailurePolicy" in rjob(m)["template"]["spec"], False),
    ("network", lambda e: e.jobset.network.CopyFrom(W.JobSetExecutable.Network(
        enable_dns_hostnames=True, subdomain="svc", publish_not_ready_addresses=False)),
     lambda m: m["spec"]["network"], {"enableDNSHostnames": True, "subdomain": "svc", "publishNotReadyAddresses": False}),
    ("coordinator", lambda e: e.jobset.coordinator.CopyFrom(W.JobSetExecutable.Coordinator(replicated_job="trainer", job_index=0, pod_index=0)),
     lambda m: m["spec"]["coordinator"], {"replicatedJob": "trainer", "jobIndex": 0, "podIndex": 0}),
    ("success_policy", lambda e: (_second_job(e), e.jobset.success_policy.CopyFrom(W.JobSetExecutable.SuccessPolicy(
        operator=W.JobSetExecutable.SuccessPolicy.ANY, target_replicated_jobs=["worker"]))),
     lambda m: m["spec"]["successPolicy"], {"operator": "Any", "targetReplicatedJobs": ["worker"]}),
    ("jobset annotations+labels", lambda e: (e.jobset.annotations.update({"a": "1"}), e.jobset.labels.update({"team": "x"})),
     lambda m: (m["metadata"]["annotations"]["a"], m["metadata"]["labels"]["team"]), ("1", "x")),
    ("scheduling_constraints.queue_name", lambda e: setattr(e.scheduling_constraints, "queue_name", "gpu-queue"),
     lambda m: m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "gpu-queue"),
]

GPU_CASES = [(name, label) for name, label in sorted(GPU_ACCELERATORS.items())]
TPU_CASES = [
    ("tpu-v5-lite-podslice", "2x4", "4"), ("tpu-v5-lite-device", "2x2", "4"), ("tpu-v4-podslice", "2x2x1", "4"),
    ("tpu-v6e-slice", "1x1", "1"), ("tpu-v5p-slice", "2x2x2", "4"), ("tpu7x", "2x2x1", "4"),
]

STAMP = dict(eid=3, last_edit_ns=1_700_000_000_123_456_789, notify_when="STOPPED,FAILED", priority="HIGH")


def _build(exe: W.Executable, ns: str) -> dict[str, Any]:
    validate_executable(exe)
    return build_jobset(exe, Stamp(xid=424242, wid=next(_wid), **STAMP), namespace=ns)


def _accepted(cluster: Any, manifest: dict[str, Any], tmp_path: Any) -> None:
    """The simulator accepts the manifest: a real create, and kubectl's server-side dry run."""
    created = client.custom_objects().create_namespaced_custom_object(
        client.JOBSET_GROUP, client.JOBSET_VERSION, manifest["metadata"]["namespace"], client.JOBSET_PLURAL, manifest)
    assert created["metadata"]["name"] == manifest["metadata"]["name"]
    again = json.loads(json.dumps(manifest))
    again["metadata"]["name"] += "-dry"
    env = dict(os.environ, KUBECACHEDIR=str(tmp_path / "kcache"))
    env.pop("KUBECONFIG", None)
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig_path), "--cache-dir", str(tmp_path / "kcache"),
         "apply", "--dry-run=server", "-f", "-"], input=json.dumps(again), capture_output=True, text=True,
        timeout=60, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "(server dry run)" in proc.stdout


@pytest.mark.parametrize("case, change, read, expected", CASES, ids=[c[0] for c in CASES])
def test_it_maps_each_executable_field(case: str, change: Callable[[W.Executable], Any],
                                       read: Callable[[dict[str, Any]], Any], expected: Any,
                                       api_cluster: Any, tmp_path: Any) -> None:
    exe = base()
    change(exe)
    manifest = _build(exe, "default")
    assert read(manifest) == expected
    _accepted(api_cluster, manifest, tmp_path)


@pytest.mark.parametrize("gpu, label", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_it_places_each_gpu_type(gpu: str, label: str, api_cluster: Any, tmp_path: Any) -> None:
    exe = base()
    job(exe).spec.resources.CopyFrom(R.ResourceSet(gpu_resources=R.GpuResources(type=gpu, count=8)))
    manifest = _build(exe, "default")
    assert main(manifest)["resources"] == {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    assert pod(manifest)["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": label}
    _accepted(api_cluster, manifest, tmp_path)


@pytest.mark.parametrize("tpu, topology, chips", TPU_CASES, ids=[c[0] for c in TPU_CASES])
def test_it_places_each_tpu_type(tpu: str, topology: str, chips: str, api_cluster: Any, tmp_path: Any) -> None:
    exe = base()
    job(exe).spec.resources.CopyFrom(R.ResourceSet(tpu_resources=R.TpuResources(type=tpu, topology=topology)))
    manifest = _build(exe, "default")
    assert main(manifest)["resources"] == {"requests": {"google.com/tpu": chips}, "limits": {"google.com/tpu": chips}}
    assert pod(manifest)["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": tpu, "cloud.google.com/gke-tpu-topology": topology}
    _accepted(api_cluster, manifest, tmp_path)


def test_it_stamps_identity_finalizer_suspend_queue_and_priority() -> None:
    manifest = build_jobset(base(), Stamp(xid=12, wid=3, **STAMP), namespace="team-a")
    assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert manifest["metadata"]["name"] == "xmc-12-3"
    assert manifest["metadata"]["namespace"] == "team-a"
    assert manifest["metadata"]["labels"] == {
        "xmc.google.com/xid": "12", "xmc.google.com/wid": "3", "xmc.google.com/execution-id": "3",
        "xmc.google.com/last-edit": "1700000000123456789", "kueue.x-k8s.io/queue-name": "cpu-queue",
        "kueue.x-k8s.io/priority-class": "high",
    }
    assert manifest["metadata"]["annotations"] == {"xmc.google.com/notify-when": "STOPPED,FAILED"}
    assert manifest["metadata"]["finalizers"] == [FINALIZER]
    assert manifest["spec"]["suspend"] is True


def test_it_leaves_out_the_notify_when_annotation_when_nobody_wants_it() -> None:
    manifest = build_jobset(base(), Stamp(xid=12, wid=3, eid=1, last_edit_ns=1), namespace="default")
    assert "annotations" not in manifest["metadata"]
    assert "kueue.x-k8s.io/priority-class" not in manifest["metadata"]["labels"]


def test_it_keeps_the_longest_name_a_dns_label() -> None:
    manifest = build_jobset(base(), Stamp(xid=2**63 - 1, wid=2**31, eid=1, last_edit_ns=1), namespace="default")
    assert len(manifest["metadata"]["name"]) <= 63


INVALID: list[tuple[str, Callable[[W.Executable], Any], str]] = [
    ("host network without exclusive topology", lambda e: setattr(job(e), "host_network", True),
     "work_unit.executable.jobset.jobs[0].host_network"),
    ("dependency on the first job", lambda e: (_second_job(e), job(e, 0).dependency_order.CopyFrom(
        W.KubernetesJob.DependencyOrder(job_name="worker"))), "work_unit.executable.jobset.jobs[0].dependency_order"),
    ("mount of an unknown volume", lambda e: job(e).spec.volume_mounts.add(name="nope", mount_path="/x"),
     "work_unit.executable.jobset.jobs[0].spec.volume_mounts[0].name"),
    ("volume without a source", lambda e: job(e).volumes.add(name="v"), "work_unit.executable.jobset.jobs[0].volumes[0].source"),
    ("port out of range", lambda e: job(e).spec.ports.add(container_port=70000),
     "work_unit.executable.jobset.jobs[0].spec.ports[0].container_port"),
    ("bad env name", lambda e: job(e).spec.env.add(name="1BAD", value="x"), "work_unit.executable.jobset.jobs[0].spec.env[0].name"),
    ("bad restart policy", lambda e: setattr(job(e), "restart_policy", "Always"),
     "work_unit.executable.jobset.jobs[0].restart_policy"),
    ("sidecar without a name", lambda e: job(e).sidecars.add(docker_image="x"), "work_unit.executable.jobset.jobs[0].sidecars[0].name"),
    ("coordinator of an unknown job", lambda e: e.jobset.coordinator.CopyFrom(W.JobSetExecutable.Coordinator(replicated_job="x")),
     "work_unit.executable.jobset.coordinator.replicated_job"),
    ("bad queue name", lambda e: setattr(e.scheduling_constraints, "queue_name", "Not_A_Queue"),
     "work_unit.executable.scheduling_constraints.queue_name"),
    ("bad dns policy", lambda e: setattr(job(e), "dns_policy", "Whatever"), "work_unit.executable.jobset.jobs[0].dns_policy"),
]


@pytest.mark.parametrize("case, change, field", INVALID, ids=[c[0] for c in INVALID])
def test_it_refuses_what_the_cluster_would_refuse_naming_the_field(case: str, change: Callable[[W.Executable], Any],
                                                                   field: str) -> None:
    exe = base()
    change(exe)
    with pytest.raises(InvalidArgument) as info:
        validate_executable(exe)
    assert info.value.field == field


def test_it_refuses_a_job_name_that_makes_pod_names_too_long() -> None:
    exe = base()
    job(exe).name = "a" * 40
    with pytest.raises(InvalidArgument) as info:
        build_jobset(exe, Stamp(xid=123456789012, wid=1, eid=1, last_edit_ns=1), namespace="default")
    assert info.value.field == "work_unit.executable.jobset.jobs[0].name"
