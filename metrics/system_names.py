"""The names XMC records system metrics under (docs/architecture/system_metrics.md)."""

GPU_UTILIZATION = "system/gpu_utilization"
GPU_MEMORY_USED_BYTES = "system/gpu_memory_used_bytes"
CPU_USAGE_CORES = "system/cpu_usage_cores"
MEMORY_WORKING_SET_BYTES = "system/memory_working_set_bytes"
