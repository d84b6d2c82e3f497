"""What the actuator's retries and dead letters change for the people who launched the work.

Called by the actuator's runner (``k8s_bridge.actuator.runner``) and, for the
re-queue, by the admin through ``workunits.services.requeue_dead_letter``.
STATES.md "Who writes what", as extended in
docs/architecture/jobset_and_work_unit_states.md:

* while a task is retried (:func:`record_actuator_retry`) its execution
  carries a WARNING system message saying how often the cluster refused it,
  why, and when the next try comes; no state change;
* the operation that ends in error (:func:`dead_letter_operation`) is
  finished, its DeadLetter written, and its execution moved, in one
  transaction, to what the rules give: a Create or Restart whose execution is
  still being handed to the cluster (``INITIALIZING`` / ``RESTARTING``, the
  current execution) goes to ``FAILED`` with an ERROR message naming the
  cause and what to do; a Delete leaves ``STOPPING`` (the JobSet may still be
  there: only the finalizer path or the orphan sweep may end it) with an
  ERROR message; an Update leaves the state with a WARNING. A stop that came
  first wins (``STOPPING`` stays), and a terminal or superseded execution is
  left as it is.

After commit the transition goes to ``workunits.hooks.on_transitions_committed``
(the pages' live updates and the WORK_UNIT_FAILED notification); a change of
message alone is handed on as a transition whose old and new state are the
same, so an open page reads the unit again.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from core import convert, pb
from workunits import state
from workunits.choices import TERMINAL, TaskType, WorkUnitState, Writer
from workunits.hooks import Transition, on_transitions_committed
from workunits.models import DeadLetter, Operation, WorkUnitExecution
from workunits.services._rows import _now_ns
from workunits.services.executions import _apply_updates, _lock_work_units
from workunits.services.operations import complete_in_transaction
from workunits.state import ExecutionUpdate

S = WorkUnitState
Severity = pb.structured_message.StructuredMessage.Severity

#: What the cluster was asked to do, per task type, as a person reads it.
_WHAT = {
    TaskType.CREATE: "the JobSet",
    TaskType.RESTART: "the restarted JobSet",
    TaskType.DELETE: "the deletion of the JobSet",
    TaskType.UPDATE: "the notify-when update of the JobSet",
}
#: The states in which an execution is still being handed to the cluster.
_HANDING_OVER = frozenset({S.INITIALIZING, S.RESTARTING})


@dataclass(frozen=True)
class Refusal:
    """Why the actuator gave up (or is about to try again)."""

    code: str
    message: str
    attempts: int
    #: the cluster said no for good (422, 404, ...): a re-queue cannot help
    permanent: bool = False


def _message(severity: int, text: str) -> dict[str, Any]:
    return convert.to_json(pb.structured_message.StructuredMessage(
        severity=severity,
        source=pb.structured_message.StructuredMessage.Source.XMANAGER_BACKEND,
        user_facing_text=text,
    ))


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _short(error: str, limit: int = 200) -> str:
    error = " ".join(error.split())
    return error if len(error) <= limit else error[: limit - 1] + "…"


def retry_text(task_type: str, refusal: Refusal, countdown: float) -> str:
    """``the cluster refused the JobSet 3 times: Kubernetes API 500 ...; retrying in 20 s``."""
    what = _WHAT.get(TaskType(task_type), "the task") if task_type in TaskType.values else "the task"
    return (f"the cluster refused {what} {_times(refusal.attempts)}: {_short(refusal.message)};"
            f" retrying in {max(1, round(countdown))} s")


def dead_letter_text(task_type: str, refusal: Refusal, elapsed_s: float) -> str:
    """The ERROR a person reads when the actuator gave up: cause, how long, and what to do."""
    what = _WHAT.get(TaskType(task_type), "the task") if task_type in TaskType.values else "the task"
    if refusal.permanent:
        return (f"the cluster refused {what}: {_short(refusal.message)}; it will not be retried:"
                " correct the job and launch it again")
    over = f" over {_duration(elapsed_s)}" if refusal.attempts > 1 else ""
    return (f"the cluster refused {what} {_times(refusal.attempts)}{over}: {_short(refusal.message)};"
            " an operator can re-queue it")


def _execution_of(op: Operation) -> tuple[int, str, int] | None:
    """(current eid, state, state time) of the execution ``op`` targets, when it is the current one.

    The caller holds the work unit's row lock.
    """
    if op.work_unit_id is None or op.eid is None:
        return None
    row = (WorkUnitExecution.objects.filter(work_unit_id=op.work_unit_id, eid=op.eid)
           .values("state", "state_update_time_ns", "work_unit__current_eid").first())
    if row is None or int(row["work_unit__current_eid"]) != op.eid:
        return None
    return op.eid, str(row["state"]), int(row["state_update_time_ns"] or 0)


def _publish(xid: int, wid: int, eid: int, old: str, transitions: list[Transition]) -> None:
    """After commit: the transitions, or the message-only change as a same-state one."""
    told = transitions or [Transition(xid, wid, eid, old, old)]
    transaction.on_commit(partial(on_transitions_committed, told))


def record_actuator_retry(operation_id: int, refusal: Refusal, countdown: float, *,
                          now: datetime | None = None) -> bool:
    """The actuator will try ``operation_id`` again in ``countdown`` s: say so on its execution.

    A WARNING system message on the operation's execution while it is the
    current one and not terminal (one durable transaction); True when written.
    """
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        op = Operation.objects.select_related("work_unit").filter(id=operation_id).first()
        if op is None or op.done or op.work_unit is None:
            return False
        xid, wid = op.experiment_id, op.work_unit.wid
        _lock_work_units([(xid, wid)])
        current = _execution_of(op)
        if current is None or current[1] in TERMINAL:
            return False
        eid, old, _ = current
        transitions = _apply_updates([ExecutionUpdate(
            xid=xid, wid=wid, eid=eid, mask=(state.SYSTEM_MESSAGE,),
            system_message=_message(Severity.WARNING, retry_text(op.task_type, refusal, countdown)),
            force_status_message_update=True, writer=Writer.ACTUATOR, operation_id=op.id,
        )], now)
        _publish(xid, wid, eid, old, transitions)
        return True


def dead_letter_operation(
    operation_id: int,
    refusal: Refusal,
    *,
    task_name: str,
    task_type: str,
    payload: bytes,
    now: datetime | None = None,
) -> DeadLetter:
    """The actuator gave up on ``operation_id``: finish it, keep the DeadLetter, and move its execution.

    One durable transaction (the operation's row, then the work unit's lock,
    then the experiment's: the order of every other writer). When another run
    finished the operation first, only the DeadLetter is written.
    """
    now = now or timezone.now()
    error = {"code": pb.rpc_code.Code.Value(refusal.code) if refusal.code in pb.rpc_code.Code.keys() else 2,
             "message": refusal.message}
    with transaction.atomic(durable=True):
        op = Operation.objects.select_related("work_unit").filter(id=operation_id).first()
        finished = op is not None and complete_in_transaction(op, error=error, now=now)
        letter = DeadLetter.objects.create(
            task_name=task_name, task_type=task_type, payload=payload,
            operation_id=op.id if op is not None else None, error_code=refusal.code,
            error_message=refusal.message[:10_000], attempts=refusal.attempts, created_time=now,
        )
        if op is None or not finished or op.work_unit is None:
            return letter
        xid, wid = op.experiment_id, op.work_unit.wid
        _lock_work_units([(xid, wid)])
        current = _execution_of(op)
        if current is None:
            return letter  # superseded by a restart, or gone: its story is over
        eid, old, stored_ns = current
        text = dead_letter_text(op.task_type, refusal, (now - op.create_time).total_seconds())
        update: ExecutionUpdate | None = None
        if op.task_type in (TaskType.CREATE, TaskType.RESTART) and old in _HANDING_OVER:
            update = ExecutionUpdate(
                xid=xid, wid=wid, eid=eid, mask=(state.STATE, state.SYSTEM_MESSAGE), state=S.FAILED,
                state_update_time_ns=max(_now_ns(now), stored_ns), system_message=_message(Severity.ERROR, text),
                force_status_message_update=True, writer=Writer.ACTUATOR, operation_id=op.id,
            )
        elif op.task_type == TaskType.DELETE and old == S.STOPPING:
            update = ExecutionUpdate(
                xid=xid, wid=wid, eid=eid, mask=(state.SYSTEM_MESSAGE,), system_message=_message(Severity.ERROR, text),
                force_status_message_update=True, writer=Writer.ACTUATOR, operation_id=op.id,
            )
        elif op.task_type == TaskType.UPDATE and old not in TERMINAL:
            update = ExecutionUpdate(
                xid=xid, wid=wid, eid=eid, mask=(state.SYSTEM_MESSAGE,),
                system_message=_message(Severity.WARNING, text + " (lifecycle events of this run may be missing)"),
                writer=Writer.ACTUATOR, operation_id=op.id,
            )
        if update is not None:
            _publish(xid, wid, eid, old, _apply_updates([update], now))
        return letter
