"""What a running simulated pod uses: CPU, memory and its GPUs, as a pure function of its script.

The kubelet stand-in (`simulators.cluster.controllers.kubelet.Kubelet.pod_usage`) calls
:func:`pod_usage` for each pod whose main container runs, with the seconds since the
container started (``t``); the HTTP layer (`simulators.cluster.podmetrics`) renders
the result as metrics-server's PodMetrics, cAdvisor's and NVIDIA DCGM exporter's
Prometheus text. docs/architecture/simulator_controllers.md describes the model:

* GPUs: a container's ``nvidia.com/gpu`` limit (or request). Each GPU's
  utilisation is the script's ``gpu=util:<expr>`` at ``t`` and its memory used
  the ``mem:<expr>`` fraction of the model's memory (clamped to 0-1); without
  the key a GPU is 90% busy with half its memory in use. The model comes from the
  pod's ``cloud.google.com/gke-accelerator`` node selector (:data:`GPU_MODELS`).
* CPU: half the container's CPU request (else limit, else 0.1 core) while it
  runs; the counter is that rate times ``t`` (it restarts with the container,
  as cAdvisor's does).
* Memory working set: half the container's memory request (else limit, else
  256 MiB); with the script's ``oom`` flag and a finite ``run``, it climbs
  from half to 98% of the limit over the run, so the job is near its limit
  before the kernel kills it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from simulators.cluster.controllers.quantity import parse_quantity
from simulators.cluster.controllers.script import Script, metric_value

GPU_RESOURCE = "nvidia.com/gpu"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-accelerator"
#: GKE accelerator name -> (DCGM modelName, framebuffer MiB, idle W, max W).
GPU_MODELS: dict[str, tuple[str, int, float, float]] = {
    "nvidia-tesla-t4": ("Tesla T4", 15360, 10.0, 70.0),
    "nvidia-l4": ("NVIDIA L4", 23034, 16.0, 72.0),
    "nvidia-tesla-v100": ("Tesla V100-SXM2-16GB", 16384, 40.0, 300.0),
    "nvidia-tesla-a100": ("NVIDIA A100-SXM4-40GB", 40960, 55.0, 400.0),
    "nvidia-a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920, 60.0, 400.0),
    "nvidia-h100-80gb": ("NVIDIA H100 80GB HBM3", 81559, 70.0, 700.0),
}
DEFAULT_MODEL = "nvidia-tesla-a100"
DEFAULT_UTIL = "0.9"
DEFAULT_MEM = "0.5"
DEFAULT_CPU_CORES = 0.1
DEFAULT_MEMORY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class GpuUsage:
    index: int
    uuid: str
    model: str
    utilization: float  # 0-1
    fb_used_mib: float
    fb_free_mib: float
    power_w: float


@dataclass(frozen=True)
class ContainerUsage:
    name: str
    image: str
    cpu_cores: float
    cpu_seconds: float
    memory_bytes: float
    memory_limit_bytes: float | None
    gpus: tuple[GpuUsage, ...]


@dataclass(frozen=True)
class PodUsage:
    namespace: str
    name: str
    uid: str
    node: str
    time: float  # simulated time of the sample
    containers: tuple[ContainerUsage, ...]
    labels: tuple[tuple[str, str], ...] = ()


def _quantity(resources: dict[str, Any], kind: str, name: str) -> float | None:
    value = (resources.get(kind) or {}).get(name)
    if value is None:
        return None
    try:
        return float(parse_quantity(value))
    except ValueError:
        return None


def _clamp(value: float | None, default: float) -> float:
    return default if value is None else min(1.0, max(0.0, value))


def gpu_uuid(pod_uid: str, container: str, index: int) -> str:
    """A stable ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` for one GPU of one container."""
    h = hashlib.sha1(f"{pod_uid}/{container}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def pod_usage(pod: dict[str, Any], script: Script, t: float, node: str, now: float) -> PodUsage:
    """What ``pod`` uses ``t`` seconds after its container started (simulated time ``now``)."""
    md, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    accelerator = (spec.get("nodeSelector") or {}).get(ACCELERATOR_SELECTOR) or DEFAULT_MODEL
    model, fb_mib, idle_w, max_w = GPU_MODELS.get(accelerator, GPU_MODELS[DEFAULT_MODEL])
    util = _clamp(metric_value(script.gpu_util or DEFAULT_UTIL, t, 0), 0.0)
    mem = _clamp(metric_value(script.gpu_mem or DEFAULT_MEM, t, 0), 0.0)
    gpu_index = 0
    containers = []
    for c in spec.get("containers") or []:
        resources = c.get("resources") or {}
        name = str(c.get("name") or "main")
        gpus = int(_quantity(resources, "limits", GPU_RESOURCE) or _quantity(resources, "requests", GPU_RESOURCE) or 0)
        cpu = (_quantity(resources, "requests", "cpu") or _quantity(resources, "limits", "cpu") or DEFAULT_CPU_CORES) / 2
        limit = _quantity(resources, "limits", "memory")
        base = (_quantity(resources, "requests", "memory") or limit or DEFAULT_MEMORY_BYTES) / 2
        working = base
        if script.oom and script.run and limit:
            working = limit * (0.5 + 0.48 * min(1.0, t / script.run))
        used = fb_mib * mem
        containers.append(ContainerUsage(
            name=name, image=str(c.get("image") or ""), cpu_cores=cpu, cpu_seconds=cpu * t, memory_bytes=working,
            memory_limit_bytes=limit,
            gpus=tuple(GpuUsage(gpu_index + i, gpu_uuid(str(md.get("uid", "")), name, i), model, util, used,
                                fb_mib - used, idle_w + util * (max_w - idle_w)) for i in range(gpus))))
        gpu_index += gpus
    return PodUsage(str(md.get("namespace") or ""), str(md.get("name") or ""), str(md.get("uid") or ""), node, now,
                    tuple(containers), tuple(sorted((md.get("labels") or {}).items())))
