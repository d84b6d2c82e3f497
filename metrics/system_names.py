"""The names XMC records system metrics under (docs/architecture/system_metrics.md)."""

GPU_UTILIZATION = "system/gpu_utilization"
GPU_MEMORY_USED_BYTES = "system/gpu_memory_used_bytes"
CPU_USAGE_CORES = "system/cpu_usage_cores"
MEMORY_WORKING_SET_BYTES = "system/memory_working_set_bytes"

#: Every system metric's name starts with it: the sweep table's and the CLI's default metric columns
#: leave them out (the unit page's "System" group and ``xmc status --system`` show them).
PREFIX = "system/"


def own_metrics(names: list[str]) -> list[str]:
    """The job's own metrics among ``names`` (not the ones XMC records from the cluster), in order."""
    return [n for n in names if not n.startswith(PREFIX)]
