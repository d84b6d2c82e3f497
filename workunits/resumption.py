"""Resumption runs: re-send what the pause handler held, skip what no longer applies.

Who calls it: the Celery task ``xmc.resumption.run`` (``workunits.tasks``,
queue ``resumption``) started by ``workunits.scheduling.resume`` from the
admin and REST, and ``manage.py resume_scheduling``, which runs
:func:`run` inline with a progress bar. The periodic ``xmc.resumption.cleanup``
calls :func:`delete_expired`.

One run, identified by its ``run_id``, repeats one transaction per batch:

1. stop if scheduling was paused again (the rest waits for the next resume);
2. lock the oldest unprocessed rows ``FOR UPDATE OF`` the paused task
   ``SKIP LOCKED``, left-joined with their work unit and its current
   execution, so two runs at once never see the same row;
3. decide each row with the pure :func:`skip_reason` (the rules of
   STATES.md, plus "work unit gone" and "payload unreadable", recorded so the
   row still expires);
4. re-sign and send the rest with ``workunits.outbox.publish`` (fresh expiry),
   several work units at a time (:func:`send_all`);
5. mark every row RESUMED or SKIPPED with ``processed_time``, the run id and
   the skip reason; commit.

Sending happens inside the batch's transaction, before the rows are marked:
a crash between the two re-sends that batch on the next run (at least once;
the actuator is idempotent: a Create finding its own JobSet succeeds, a
Restart finding ``k8s_eid > target`` is done), whereas sending after commit
could lose a task for good. A killed run therefore loses nothing: its
uncommitted batch rolls back, its locks die with its connection, and the next
run picks the rows up.
"""
from __future__ import annotations

import logging
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from core import task_wire
from core.protos import task_pb2
from workunits import hooks, outbox
from workunits.choices import ExecutionState, ResolutionStatus, TaskType, WorkUnitState
from workunits.models import PausedTask, SchedulingSwitch, WorkUnit, WorkUnitExecution

log = logging.getLogger(__name__)
S = WorkUnitState

#: Processed rows are deleted this long after ``processed_time``.
RETENTION = timedelta(days=7)

#: Threads sending one batch to the broker. Each send is a Redis round trip;
#: sending serially made the broker latency the whole cost of a resume
#: (bench/resume.py). Tasks of one work unit stay in one thread, in order.
SEND_CONCURRENCY = 8


class SkipReason(models.TextChoices):
    WORK_UNIT_GONE = "work_unit_gone", "the work unit no longer exists"
    SUPERSEDED_EXECUTION = "superseded_execution", "a newer execution is current"
    WORK_UNIT_STOPPING = "work_unit_stopping", "the work unit is stopping"
    WORK_UNIT_STOPPED = "work_unit_stopped", "the work unit is stopped"
    WORK_UNIT_COMPLETED = "work_unit_completed", "the work unit completed"
    WORK_UNIT_FAILED = "work_unit_failed", "the work unit failed"
    UPDATE_SUPERSEDED = "update_superseded", "a newer Update for the work unit supersedes it"
    UPDATE_BEFORE_JOBSET = "update_before_jobset", "the work unit is still SCHEDULING_PAUSED (no JobSet to patch)"
    INVALID_PAYLOAD = "invalid_payload", "the stored task does not parse"


#: A task for a work unit in one of these states is never re-sent.
_FINISHED: dict[str, SkipReason] = {
    S.STOPPING: SkipReason.WORK_UNIT_STOPPING,
    S.STOPPED: SkipReason.WORK_UNIT_STOPPED,
    S.COMPLETED: SkipReason.WORK_UNIT_COMPLETED,
    S.FAILED: SkipReason.WORK_UNIT_FAILED,
}


def skip_reason(
    *, task_type: str, task_eid: int, current_eid: int | None, current_state: str | None, newer_update: bool
) -> SkipReason | None:
    """Why a held task must not be re-sent, or None to re-send it (pure).

    ``task_eid`` is the execution the task is for: for a Restart that is the
    new execution N+1 (``Task.eid``), so "current eid newer than the task's
    eid" is STATES.md's "newer than eid + 1" counted from the restarted N.
    """
    if current_eid is None or current_state is None:
        return SkipReason.WORK_UNIT_GONE
    if current_eid > task_eid:
        return SkipReason.SUPERSEDED_EXECUTION
    finished = _FINISHED.get(current_state)
    if finished is not None:
        return finished
    if task_type == TaskType.UPDATE:
        if newer_update:
            return SkipReason.UPDATE_SUPERSEDED
        if current_state == S.SCHEDULING_PAUSED:
            return SkipReason.UPDATE_BEFORE_JOBSET
    return None


@dataclass
class RunSummary:
    run_id: uuid.UUID
    resumed: int = 0
    skipped: int = 0
    skipped_by_reason: Counter[str] = field(default_factory=Counter)
    #: True when the run stopped because scheduling was paused again.
    interrupted: bool = False

    @property
    def processed(self) -> int:
        return self.resumed + self.skipped


@dataclass(frozen=True)
class _Row:
    id: int
    task_type: str
    payload: bytes
    xid: int
    wid: int
    eid: int
    current_eid: int | None
    current_state: str | None


def _lock_batch(batch_size: int) -> list[_Row]:
    """The oldest unprocessed rows no other run holds, with their work units (caller holds the transaction)."""
    pt, wu, ex = PausedTask._meta.db_table, WorkUnit._meta.db_table, WorkUnitExecution._meta.db_table
    sql = f"""
        SELECT p.id, p.task_type, p.payload, p.xid, p.wid, p.eid, w.current_eid, e.state
        FROM {pt} p
        LEFT JOIN {wu} w ON w.experiment_id = p.xid AND w.wid = p.wid
        LEFT JOIN {ex} e ON e.work_unit_id = w.id AND e.execution_state = %s
        WHERE p.processed_time IS NULL
        ORDER BY p.created_time, p.id
        LIMIT %s
        FOR UPDATE OF p SKIP LOCKED
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [ExecutionState.ACTIVE.value, batch_size])
        return [_Row(r[0], r[1], bytes(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in cursor.fetchall()]


def _newest_updates(rows: Sequence[_Row]) -> dict[tuple[int, int], int]:
    """(xid, wid) -> id of the newest Update row held for that work unit (processed or not)."""
    keys = {(r.xid, r.wid) for r in rows if r.task_type == TaskType.UPDATE}
    if not keys:
        return {}
    condition = Q()
    for xid, wid in keys:
        condition |= Q(xid=xid, wid=wid)
    newest = (
        PausedTask.objects.filter(condition, task_type=TaskType.UPDATE)
        .order_by("xid", "wid", "-created_time", "-id")
        .distinct("xid", "wid")
        .values_list("xid", "wid", "id")
    )
    return {(xid, wid): id_ for xid, wid, id_ in newest}


def _paused_again() -> bool:
    return SchedulingSwitch.objects.filter(id=1, paused=True).exists()


def _prepare(row: _Row) -> task_pb2.Task:
    task = task_wire.decode(row.payload)
    if row.task_type in (TaskType.CREATE, TaskType.RESTART):
        # An artifact attached while the task was held produced an Update that
        # is skipped (no JobSet yet): the Create/Restart carries the current
        # notify-when instead.
        task.notify_when = hooks.notify_when_for(row.xid, row.wid)
    return task


def send_all(items: Sequence[tuple[_Row, task_pb2.Task]]) -> None:
    """Re-sign and send ``items`` with ``workunits.outbox.publish``, several work units at a time.

    The tasks of one work unit are sent by one thread in their order (oldest
    first); different work units do not depend on each other's order. The
    first failure is raised after every thread has finished.
    """
    groups: dict[tuple[int, int], list[task_pb2.Task]] = defaultdict(list)
    for row, task in items:
        groups[(row.xid, row.wid)].append(task)
    if len(groups) <= 1:
        for tasks in groups.values():
            for task in tasks:
                outbox.publish(task)
        return
    lanes: list[list[task_pb2.Task]] = [[] for _ in range(min(SEND_CONCURRENCY, len(groups)))]
    for i, tasks in enumerate(groups.values()):
        lanes[i % len(lanes)].extend(tasks)

    def send_lane(lane: list[task_pb2.Task]) -> None:
        for task in lane:
            outbox.publish(task)

    with ThreadPoolExecutor(max_workers=len(lanes), thread_name_prefix="resume-send") as pool:
        futures = [pool.submit(send_lane, lane) for lane in lanes]
    for future in futures:
        future.result()


def run_batch(run_id: uuid.UUID, batch_size: int, summary: RunSummary, *, now: datetime | None = None) -> int:
    """Process one batch in one transaction; returns how many rows it processed (0: nothing left)."""
    with transaction.atomic(durable=True):
        if _paused_again():
            summary.interrupted = True
            return 0
        rows = _lock_batch(batch_size)
        if not rows:
            return 0
        newest = _newest_updates(rows)
        resumed: list[int] = []
        skipped: dict[str, list[int]] = {}
        to_send: list[tuple[_Row, task_pb2.Task]] = []
        for row in rows:
            reason = skip_reason(
                task_type=row.task_type, task_eid=row.eid, current_eid=row.current_eid,
                current_state=row.current_state, newer_update=newest.get((row.xid, row.wid), row.id) != row.id,
            )
            task: task_pb2.Task | None = None
            if reason is None:
                try:
                    task = _prepare(row)
                except task_wire.InvalidTask:
                    reason = SkipReason.INVALID_PAYLOAD
            if reason is not None or task is None:
                skipped.setdefault(str(reason), []).append(row.id)
                continue
            to_send.append((row, task))
            resumed.append(row.id)
        # Raises if the broker refuses any: the batch rolls back, nothing is marked.
        send_all(to_send)
        now = now or timezone.now()
        common = {"processed_time": now, "resumption_run_id": run_id}
        if resumed:
            PausedTask.objects.filter(id__in=resumed).update(
                resolution_status=ResolutionStatus.RESUMED, skip_reason="", **common)
        for why, ids in skipped.items():
            PausedTask.objects.filter(id__in=ids).update(
                resolution_status=ResolutionStatus.SKIPPED, skip_reason=why, **common)
            summary.skipped_by_reason[why] += len(ids)
        summary.resumed += len(resumed)
        summary.skipped += sum(len(ids) for ids in skipped.values())
        log.info("resumption.batch", extra={"run_id": str(run_id), "resumed": len(resumed),
                                            "skipped": len(rows) - len(resumed)})
        return len(rows)


def run(
    run_id: uuid.UUID | str,
    *,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> RunSummary:
    """Process unprocessed paused tasks, oldest first, until none is left (or paused again).

    ``progress(n)`` is called after each committed batch with its row count.
    Safe to run several at once: each row is processed by exactly one run.
    """
    run_id = uuid.UUID(str(run_id))
    summary = RunSummary(run_id=run_id)
    while True:
        done = run_batch(run_id, batch_size, summary)
        if not done:
            break
        if progress is not None:
            progress(done)
    log.info("resumption.finished", extra={"run_id": str(run_id), "resumed": summary.resumed,
                                           "skipped": summary.skipped, "interrupted": summary.interrupted})
    return summary


def delete_expired(*, now: datetime | None = None) -> int:
    """Delete rows processed more than :data:`RETENTION` ago; returns how many."""
    cutoff = (now or timezone.now()) - RETENTION
    deleted, _ = PausedTask.objects.filter(processed_time__isnull=False, processed_time__lt=cutoff).delete()
    if deleted:
        log.info("resumption.cleanup", extra={"deleted": deleted})
    return deleted
