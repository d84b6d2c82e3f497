"""Scheduling pause seam (STATES.md "Pause and resume of scheduling").

The runner calls :func:`hold_if_paused` right after a Create, Restart or
Update task's signature is verified. When it returns True the task has been
stored as a PausedTask (and, for Create/Restart, the execution moved to
SCHEDULING_PAUSED) and the handler must not touch the cluster. The pause
issue replaces this body; until then scheduling is never paused.
"""
from __future__ import annotations

from xmc.protos import task_pb2


def hold_if_paused(task: task_pb2.Task) -> bool:
    return False
