"""Validation of a WorkUnit's Executable before anything is written.

Called by ``workunits.services.create_work_unit`` (and so by every API).
The rules live with the manifest they protect, in the JobSet builder
(``k8s_bridge.jobset_builder.validate_executable``): one owner, so a work unit
the API accepts is always one the actuator can turn into a JobSet the
cluster accepts. Each problem raises ``InvalidArgument`` naming the field
path, e.g. ``work_unit.executable.jobset.jobs[1].name``.
"""
from __future__ import annotations

from k8s_bridge.jobset_builder import DNS1123_LABEL, TPU_TOPOLOGY, validate_executable, validate_resources

from core import limits, pb
from core.errors import InvalidArgument

__all__ = [
    "DNS1123_LABEL", "TPU_TOPOLOGY", "validate_executable", "validate_resources", "validate_work_unit_request",
]


def validate_work_unit_request(message: pb.work_unit.WorkUnit, work_unit_id: int) -> None:
    """CreateWorkUnit's own fields: the explicit id's range, tags and notes (``core.limits``)."""
    if work_unit_id < 0:
        raise InvalidArgument("work_unit_id must not be negative", field="work_unit_id")
    if work_unit_id > limits.MAX_WORK_UNIT_ID:
        raise InvalidArgument(
            f"work_unit_id must be at most {limits.MAX_WORK_UNIT_ID} (got {work_unit_id})", field="work_unit_id"
        )
    limits.check_fields({"tags": list(message.tags), "notes": message.notes}, "work_unit")
