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

__all__ = ["DNS1123_LABEL", "TPU_TOPOLOGY", "validate_executable", "validate_resources"]
