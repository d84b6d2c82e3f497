"""The actuator's pause handler (Go: TaskPauseHandler).

Who calls it: the actuator's Create, Restart and Update Celery tasks, after
verifying the Task signature and before touching the cluster::

    if hold_if_paused(task):
        return  # stored as a PausedTask; resumption re-sends it

Delete tasks never call it (a stop must never wait for a resume).

It passes the scheduling gate (``workunits.scheduling.enter_gate``) before
it reads the switch and keeps it until the task ends, so a pause committed
while this task is in flight waits for the task's cluster calls to finish,
and after the pause has returned no held-type task reaches the cluster. The
gate is released by the ``task_postrun`` signal of the task (also after a
failure or a retry), or by the next call on the same thread.
"""
from __future__ import annotations

from typing import Any

from celery.signals import task_postrun

from core.protos import task_pb2
from workunits import scheduling


def hold_if_paused(task: task_pb2.Task) -> bool:
    """True when ``task`` was stored as paused: the caller returns without touching the cluster.

    False: scheduling is running and this thread now holds the gate until
    the task ends (:func:`release`).
    """
    if task.type == task_pb2.Task.DELETE:
        return False
    scheduling.leave_gate()  # left over by an earlier task on this thread, if any
    scheduling.enter_gate()
    try:
        held = scheduling.hold_task(task)
    except BaseException:
        scheduling.leave_gate()
        raise
    if held:
        scheduling.leave_gate()
    return held


def release() -> None:
    """Leave the gate: the task is done with the cluster (idempotent)."""
    scheduling.leave_gate()


def _release_after_task(**kwargs: Any) -> None:
    release()


task_postrun.connect(_release_after_task, weak=False)
