"""Where events come from: the committed transitions, the scheduling switch and a periodic scan.

* :func:`on_transitions_committed` is registered in ``workunits.hooks``
  (``notifications.apps``) and runs in the writer's process after its commit:
  it records one WORK_UNIT_FAILED event per execution that entered FAILED and
  one EXPERIMENT_FINISHED event per experiment whose roll-up left ACTIVE, each
  under a unique key (inserting twice is a no-op), and hands them to the
  ``notifications`` queue for fan-out. Cheap when nobody subscribes: one
  ``EXISTS`` query.
* :func:`on_scheduling_changed`: SCHEDULING_PAUSED / SCHEDULING_RESUMED for staff.
* :func:`on_advisories`: WORK_UNIT_IDLE, once per idle episode of an execution
  (the system metrics' advisory, ``workunits.hooks.advisory_hooks``).
* :func:`scan_delivery_degraded` (the sweep): OPERATOR_DELIVERY_DEGRADED for
  staff, once per queue and backlog, when its oldest pending row has waited
  for a worker past ``XMC_DEGRADED_AFTER_S``.
* :func:`scan_queued_too_long` (the sweep): executions waiting in SCHEDULING
  longer than a subscription's ``queued_minutes``.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from experiments.choices import ActiveState
from experiments.models import Experiment
from notifications import fanout, outbox
from notifications.models import Event, EventType, Scope, Subscription
from workunits import delivery
from workunits.choices import TERMINAL, WorkUnitState
from workunits.models import WorkUnitExecution

log = logging.getLogger(__name__)


def _listened(types: Sequence[str]) -> set[str]:
    """The event types among ``types`` that some enabled subscription wants (one query)."""
    if not types:
        return set()
    wanted = Q()
    for kind in types:
        wanted |= Q(events__contains=[kind])
    found: set[str] = set()
    for events in Subscription.objects.filter(wanted, enabled=True).values_list("events", flat=True).distinct():
        found.update(e for e in events if e in types)
    return found


def _anyone_listens(types: Sequence[str]) -> bool:
    return bool(_listened(types))


def events_for(transitions: Sequence[Any], *, finished: bool = True) -> list[Event]:
    now = timezone.now()
    rows: list[Event] = []
    for t in transitions:
        if t.new_state == WorkUnitState.FAILED and t.old_state != WorkUnitState.FAILED:
            rows.append(Event(key=f"wu-failed/{t.xid}/{t.wid}/{t.eid}", type=EventType.WORK_UNIT_FAILED,
                              xid=t.xid, wid=t.wid, eid=t.eid, create_time=now,
                              data={"state": t.new_state, "previousState": t.old_state, "time": now.isoformat()}))
    ended = sorted({t.xid for t in transitions if t.new_state in TERMINAL}) if finished else []
    if ended:
        rows += finished_events(Experiment.objects.filter(id__in=ended, active_state=ActiveState.INACTIVE))
    return rows


def finished_events(experiments: Any) -> list[Event]:
    """EXPERIMENT_FINISHED events of INACTIVE experiments, keyed by the time the roll-up left ACTIVE
    (``complete_time``): a redelivered batch or the sweep gives the same key, an experiment that
    is restarted and finishes again a new one."""
    now = timezone.now()
    return [Event(key=f"xp-finished/{xid}/{done.isoformat() if done else '0'}", type=EventType.EXPERIMENT_FINISHED,
                  xid=xid, create_time=now,
                  data={"stateCounts": dict(counts or {}), **({"time": done.isoformat()} if done else {})})
            for xid, counts, done in experiments.values_list("id", "child_state_counts", "complete_time")]


def scan_finished(window_s: float = 600.0) -> list[int]:
    """The sweep: experiments that finished in the last ``window_s`` without a transition saying so
    (the launch completed after every work unit had ended) or whose event was lost."""
    if not _anyone_listens([EventType.EXPERIMENT_FINISHED]):
        return []
    since = timezone.now() - timedelta(seconds=window_s)
    recent = Experiment.objects.filter(active_state=ActiveState.INACTIVE, complete_time__gte=since)
    return fanout.record_events(finished_events(recent.order_by("id")[:1000]))


def on_transitions_committed(transitions: Sequence[Any]) -> None:
    """Record the events these committed transitions make and queue their fan-out."""
    interesting = [t for t in transitions if t.new_state in TERMINAL]
    if not interesting:
        return
    types = [EventType.WORK_UNIT_FAILED] if any(t.new_state == WorkUnitState.FAILED for t in interesting) else []
    listened = _listened([*types, EventType.EXPERIMENT_FINISHED])
    if not listened:
        return
    ids = fanout.record_events(e for e in events_for(interesting, finished=EventType.EXPERIMENT_FINISHED in listened)
                                 if e.type in listened)
    outbox.enqueue_fan_out(ids)


def on_scheduling_changed(change_id: int, paused: bool, by: str, reason: str) -> None:
    kind = EventType.SCHEDULING_PAUSED if paused else EventType.SCHEDULING_RESUMED
    if not _anyone_listens([kind]):
        return
    ids = fanout.record_events([Event(key=f"scheduling/{change_id}", type=kind, create_time=timezone.now(),
                                        data={"by": by, "reason": reason})])
    outbox.enqueue_fan_out(ids)


def on_advisories(advisories: Sequence[Any]) -> None:
    """A WORK_UNIT_IDLE event for each execution whose idle advisory was just written, keyed by the
    episode (``since``: the collection cycle that raised it), and its fan-out queued."""
    idle = [a for a in advisories if a.kind == "idle" and a.text]
    if not idle or not _anyone_listens([EventType.WORK_UNIT_IDLE]):
        return
    now = timezone.now()
    ids = fanout.record_events(
        Event(key=f"wu-idle/{a.xid}/{a.wid}/{a.eid}/{a.since}", type=EventType.WORK_UNIT_IDLE, xid=a.xid, wid=a.wid,
              eid=a.eid, create_time=now,
              data={"state": WorkUnitState.RUNNING, "message": a.text, "since": a.since, **a.data})
        for a in idle)
    outbox.enqueue_fan_out(ids)


def scan_delivery_degraded() -> list[int]:
    """One OPERATOR_DELIVERY_DEGRADED event per queue and backlog (keyed by its oldest row's time).

    Runs in the notifications sweep: where the actuator's worker has a queue of
    its own (deploy/base), a dead or frozen actuator worker is still reported.
    """
    if not _anyone_listens([EventType.OPERATOR_DELIVERY_DEGRADED]):
        return []
    now = timezone.now()
    rows = []
    for queue, since in sorted(delivery.oldest_pending_since(now).items()):
        age = (now - since).total_seconds() if since is not None else 0.0
        if since is None or age <= settings.XMC_DEGRADED_AFTER_S:
            continue
        rows.append(Event(key=f"operator/delivery-degraded/{queue}/{since.isoformat()}",
                          type=EventType.OPERATOR_DELIVERY_DEGRADED, create_time=now,
                          data={"queue": queue, "oldestPendingSeconds": round(age), "since": since.isoformat()}))
    return fanout.record_events(rows)


def scan_queued_too_long() -> list[int]:
    """One event per (subscription, execution) waiting in SCHEDULING longer than its threshold."""
    now_ns = time.time_ns()
    rows: list[Event] = []
    for sub in Subscription.objects.filter(enabled=True, events__contains=[EventType.WORK_UNIT_QUEUED_TOO_LONG]):
        waiting = WorkUnitExecution.objects.filter(
            state=WorkUnitState.SCHEDULING, state_update_time_ns__lt=now_ns - sub.queued_minutes * 60 * 10**9)
        if sub.scope == Scope.EXPERIMENT and sub.experiment_id is not None:
            waiting = waiting.filter(work_unit__experiment_id=sub.experiment_id)
        elif sub.scope == Scope.MINE:
            waiting = waiting.filter(work_unit__experiment__creator=sub.owner)
        elif sub.scope == Scope.NONE:
            continue
        for xid, wid, eid in waiting.values_list("work_unit__experiment_id", "work_unit__wid", "eid")[:1000]:
            rows.append(Event(key=f"wu-queued/{sub.id}/{xid}/{wid}/{eid}", type=EventType.WORK_UNIT_QUEUED_TOO_LONG,
                              xid=xid, wid=wid, eid=eid, create_time=timezone.now(),
                              data={"subscription": sub.id, "state": WorkUnitState.SCHEDULING,
                                    "queuedMinutes": sub.queued_minutes}))
    return fanout.record_events(rows)
