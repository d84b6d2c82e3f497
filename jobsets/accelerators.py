"""Accelerator names: XManager GPU/TPU names to GKE node labels.

One table shared by request validation (``jobsets.validation``) and the
JobSet builder (a later issue), so an accepted GPU type is always one the
builder can place.
"""
from __future__ import annotations

#: XManager ResourceType name (as xm_cloud sends it) -> GKE accelerator label.
GPU_ACCELERATORS: dict[str, str] = {
    "P4": "nvidia-tesla-p4",
    "T4": "nvidia-tesla-t4",
    "L4_24TH": "nvidia-l4",
    "P100": "nvidia-tesla-p100",
    "V100": "nvidia-tesla-v100",
    "A100": "nvidia-tesla-a100",
    "A100_80GIB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
    "H100_MEGA": "nvidia-h100-mega-80gb",
    "H200": "nvidia-h200-141gb",
    "B200": "nvidia-b200",
    "B300": "nvidia-b300",
    "GB200": "nvidia-gb200",
    "GB300": "nvidia-gb300",
}

#: GKE TPU accelerator labels xm_cloud sends as TpuResources.type.
TPU_ACCELERATORS: frozenset[str] = frozenset({
    "tpu-v3-device", "tpu-v3-slice", "tpu-v4-podslice", "tpu-v5-lite-podslice",
    "tpu-v5-lite-device", "tpu-v5p-slice", "tpu-v6e-slice", "tpu7x-standard-4t", "tpu7x",
})

#: Pod template annotation a host-network job needs (JobSet exclusive placement).
EXCLUSIVE_TOPOLOGY_ANNOTATION = "alpha.jobset.sigs.k8s.io/exclusive-topology"
