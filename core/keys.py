"""The key of one execution: experiment, work unit and execution number.

One definition for every floor: the reconciler reads it off a JobSet's labels
(``k8s_bridge.reconciler.mapping.execution_key``), the metrics write path off
a metrics token (``metrics.tokens``) and off an execution's row
(``metrics.services.execution_keys``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class ExecutionKey:
    xid: int
    wid: int
    eid: int
