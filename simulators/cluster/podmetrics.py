"""The cluster's resource metrics, in the shapes upstream serves them (docs/architecture/simulator_apiserver.md).

Rendered by the API server (`simulators.cluster.apiserver`) from what the
kubelet stand-in says the running pods use (``usage`` provider:
`simulators.cluster.controllers.usage.PodUsage` items, duck-typed here):

* :func:`pod_metrics` / :func:`pod_metrics_list`: ``metrics.k8s.io/v1beta1``
  PodMetrics as metrics-server serves them (``kubectl top pods``), at
  ``/apis/metrics.k8s.io/v1beta1/[namespaces/{ns}/]pods[/{name}]``
  (https://kubernetes.io/docs/reference/external-api/metrics.v1beta1/);
* :func:`dcgm_text`: NVIDIA DCGM exporter's Prometheus text at ``/metrics/dcgm``,
  one series per GPU of each pod that asked for GPUs, with the exporter's labels
  (https://github.com/NVIDIA/dcgm-exporter, etc/default-counters.csv);
* :func:`cadvisor_text`: the kubelet's cAdvisor metrics at ``/metrics/cadvisor``
  (``container_cpu_usage_seconds_total``, ``container_memory_working_set_bytes``,
  ``container_spec_memory_limit_bytes``; https://github.com/google/cadvisor/blob/master/docs/storage/prometheus.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from simulators.cluster.clock import format_time

GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
WINDOW = "15s"
DRIVER_VERSION = "550.54.15"
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DCGM: tuple[tuple[str, str, str, Callable[[Any], float]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: round(g.utilization * 100)),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda g: round(g.fb_free_mib)),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda g: round(g.fb_used_mib)),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: round(g.power_w, 3)),
)


def _cpu(cores: float) -> str:
    return f"{max(0, round(cores * 1e9))}n"


def _memory(n: float) -> str:
    return f"{max(0, round(n / 1024))}Ki"


def pod_metrics(usage: Any) -> dict[str, Any]:
    """One PodMetrics object (metrics-server's: CPU in nanocores, memory working set in Ki, the pod's labels)."""
    md: dict[str, Any] = {"name": usage.name, "namespace": usage.namespace, "creationTimestamp": format_time(usage.time)}
    if usage.labels:
        md["labels"] = dict(usage.labels)
    return {"kind": "PodMetrics", "apiVersion": f"{GROUP}/{VERSION}", "metadata": md,
            "timestamp": format_time(usage.time), "window": WINDOW,
            "containers": [{"name": c.name, "usage": {"cpu": _cpu(c.cpu_cores), "memory": _memory(c.memory_bytes)}}
                           for c in usage.containers]}


def pod_metrics_list(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "PodMetricsList", "apiVersion": f"{GROUP}/{VERSION}", "metadata": {}, "items": list(items)}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(str(v))}"' for k, v in pairs)


def _family(name: str, kind: str, help_text: str, lines: list[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines]


def dcgm_text(usages: Iterable[Any]) -> str:
    """The DCGM exporter's text: per GPU of each running pod that asked for GPUs."""
    rows = []
    for u in usages:
        for c in u.containers:
            for g in c.gpus:
                rows.append((g, _labels((("gpu", str(g.index)), ("UUID", g.uuid), ("pci_bus_id", f"00000000:{g.index + 4:02X}:00.0"),
                                         ("device", f"nvidia{g.index}"), ("modelName", g.model), ("Hostname", u.node),
                                         ("DCGM_FI_DRIVER_VERSION", DRIVER_VERSION), ("container", c.name),
                                         ("namespace", u.namespace), ("pod", u.name)))))
    out: list[str] = []
    for name, kind, help_text, value in _DCGM:
        out += _family(name, kind, help_text, [f"{name}{{{labels}}} {value(g)}" for g, labels in rows])
    return "\n".join(out) + "\n"


def cadvisor_text(usages: Iterable[Any]) -> str:
    """The kubelet's cAdvisor text for each running container."""
    cpu, working, limit = [], [], []
    for u in usages:
        for c in u.containers:
            common = (("container", c.name), ("id", f"/kubepods/pod{u.uid}/{c.name}"), ("image", c.image),
                      ("name", f"k8s_{c.name}_{u.name}_{u.namespace}_{u.uid}_0"), ("namespace", u.namespace),
                      ("pod", u.name))
            cpu.append(f"container_cpu_usage_seconds_total{{{_labels((*common, ('cpu', 'total')))}}} {c.cpu_seconds:.6f}")
            working.append(f"container_memory_working_set_bytes{{{_labels(common)}}} {round(c.memory_bytes)}")
            limit.append(f"container_spec_memory_limit_bytes{{{_labels(common)}}} {round(c.memory_limit_bytes or 0)}")
    out = (_family("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed in seconds.", cpu)
           + _family("container_memory_working_set_bytes", "gauge", "Current working set in bytes.", working)
           + _family("container_spec_memory_limit_bytes", "gauge", "Memory limit for the container.", limit))
    return "\n".join(out) + "\n"


UsageProvider = Callable[["str | None"], list[Any]]
