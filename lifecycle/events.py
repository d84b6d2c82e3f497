"""Lifecycle events: built on the reconciler side after commit, consumed on the ``lifecycle`` queue.

An ``xmc.internal.v1.ArtifactLifecycleEvent`` is published

* for a *committed* transition whose new state the JobSet's notify-when
  annotation names (:func:`on_transitions_committed`), and
* once when a JobSet's notify-when is newly added or changed
  (:func:`on_jobset_observed`), with ``force_notify`` and the execution's
  current committed state, so an artifact attached to a running work unit is
  caught up without waiting for the next transition.

What each JobSet's annotation was when last seen is tracked per
``(JobSet UID, eid)``: a JobSet re-created for the next execution, or a new
object with the same name, starts afresh. The first sight of an annotated
JobSet counts as newly added (after a reconciler restart the consumer may
see one event twice; it is idempotent). Publishing writes an outbox row
(``workunits.delivery.enqueue``: these hooks run after the reconciler's
commit) and sends ``xmc.lifecycle.handle_event`` with the base64 of the
serialized event and the row's id; a send the broker refused, or a message
Redis lost, is sent again by the sweep. Nothing here fails the reconciler.
"""
from __future__ import annotations

import base64
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from core import pb
from core.protos import artifact_lifecycle_event_pb2 as event_pb2
from core.queues import Queue
from lifecycle import notify_when
from workunits import delivery
from workunits.choices import WorkUnitState
from workunits.hooks import Transition
from workunits.models import WorkUnitExecution

log = logging.getLogger(__name__)

TASK_NAME = "xmc.lifecycle.handle_event"
#: How many (uid, eid) annotations the tracker remembers (least recently seen dropped first).
TRACKED_MAX = 100_000
_STATE_NUMBER = pb.status.WorkUnitStatus.WorkUnitState


@dataclass(frozen=True)
class JobSetContext:
    """The JobSet an execution runs as, as the reconciler last saw it."""

    xid: int
    wid: int
    eid: int
    namespace: str
    name: str
    uid: str
    creation_time: datetime | None
    #: The ``xmc.google.com/notify-when`` annotation ("" when absent).
    notify_when: str
    cluster: str = ""


@dataclass(frozen=True)
class Runtime:
    cluster: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""
    creation_time_ns: int = 0


@dataclass(frozen=True)
class LifecycleEvent:
    xid: int
    wid: int
    eid: int
    old_state: str
    new_state: str
    event_time_ns: int
    force_notify: bool = False
    runtime: Runtime = Runtime()

    def to_proto(self) -> event_pb2.ArtifactLifecycleEvent:
        return event_pb2.ArtifactLifecycleEvent(
            xid=self.xid, wid=self.wid, eid=self.eid,
            old_state=_STATE_NUMBER.Value(self.old_state) if self.old_state else 0,
            new_state=_STATE_NUMBER.Value(self.new_state),
            event_time_ns=self.event_time_ns, force_notify=self.force_notify,
            runtime=event_pb2.JobSetRuntimeContext(
                cluster=self.runtime.cluster, namespace=self.runtime.namespace, name=self.runtime.name,
                uid=self.runtime.uid, creation_time_ns=self.runtime.creation_time_ns,
            ),
        )

    @classmethod
    def from_proto(cls, message: event_pb2.ArtifactLifecycleEvent) -> LifecycleEvent:
        if message.xid <= 0 or message.wid <= 0 or message.eid <= 0:
            raise ValueError(f"event xid/wid/eid must be positive, got {message.xid}/{message.wid}/{message.eid}")
        if message.new_state not in _STATE_NUMBER.values() or message.new_state == 0:
            raise ValueError(f"event new_state {message.new_state} is not a work unit state")
        old = _STATE_NUMBER.Name(message.old_state) if message.old_state in _STATE_NUMBER.values() else ""
        r = message.runtime
        return cls(
            xid=message.xid, wid=message.wid, eid=message.eid,
            old_state="" if old == "WORK_UNIT_STATE_UNSPECIFIED" else old,
            new_state=_STATE_NUMBER.Name(message.new_state),
            event_time_ns=message.event_time_ns, force_notify=message.force_notify,
            runtime=Runtime(r.cluster, r.namespace, r.name, r.uid, r.creation_time_ns),
        )


def encode(event: LifecycleEvent) -> str:
    return base64.b64encode(event.to_proto().SerializeToString(deterministic=True)).decode("ascii")


def decode(text: str) -> LifecycleEvent:
    """The inverse of :func:`encode`; raises ``ValueError`` on anything malformed."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        message = event_pb2.ArtifactLifecycleEvent.FromString(raw)
    except Exception as exc:  # binascii.Error, DecodeError, UnicodeEncodeError
        raise ValueError(f"not a serialized ArtifactLifecycleEvent: {exc}") from exc
    return LifecycleEvent.from_proto(message)


def _runtime(context: JobSetContext) -> Runtime:
    created = context.creation_time
    return Runtime(
        cluster=context.cluster or settings.XMC_GKE_CLUSTER,
        namespace=context.namespace, name=context.name, uid=context.uid,
        creation_time_ns=int(created.timestamp() * 1_000_000_000) if created else 0,
    )


def publish(event: LifecycleEvent) -> bool:
    """Record ``event`` in the outbox and send it to the lifecycle queue.

    True once the row is written (the sweep re-sends it if the broker did not
    take it now); False (logged) only when even the row could not be written.
    """
    try:
        delivery.enqueue(Queue.LIFECYCLE.value, TASK_NAME, [encode(event)], committed=True)
    except Exception:
        log.exception("lifecycle.event.publish_failed", extra={"xid": event.xid, "wid": event.wid, "eid": event.eid})
        return False
    log.info("lifecycle.event.published", extra={
        "xid": event.xid, "wid": event.wid, "eid": event.eid, "state": event.new_state, "force": event.force_notify})
    return True


class NotifyWhenTracker:
    """What notify-when each (JobSet UID, eid) had when last seen (bounded, thread-safe)."""

    def __init__(self, max_entries: int = TRACKED_MAX) -> None:
        self._seen: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def newly_added(self, uid: str, eid: int, value: str) -> bool:
        """Record ``value``; True when it is non-empty and differs from what was seen last."""
        key = (uid, eid)
        with self._lock:
            previous = self._seen.get(key)
            self._seen[key] = value
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_entries:
                self._seen.popitem(last=False)
        return bool(notify_when.decode(value)) and previous != value

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()


tracker = NotifyWhenTracker()


def on_jobset_observed(context: JobSetContext, state: str) -> None:
    """Force-notify once when the JobSet's notify-when is newly added (flag on)."""
    if not tracker.newly_added(context.uid, context.eid, context.notify_when):
        return
    # The current *committed* state of that execution (the reconciler's
    # ``state`` may not be written yet, or may be refused by the guards).
    committed = (
        WorkUnitExecution.objects.filter(
            work_unit__experiment_id=context.xid, work_unit__wid=context.wid, eid=context.eid,
            work_unit__current_eid=context.eid,
        ).values_list("state", flat=True).first()
    )
    if committed is None or not notify_when.matches(context.notify_when, committed):
        return
    publish(LifecycleEvent(
        xid=context.xid, wid=context.wid, eid=context.eid, old_state=committed, new_state=committed,
        event_time_ns=time.time_ns(), force_notify=True, runtime=_runtime(context),
    ))


def on_transitions_committed(
    transitions: Sequence[Transition], contexts: Mapping[tuple[int, int, int], JobSetContext]
) -> int:
    """Publish one event per committed transition the JobSet's notify-when names; how many were sent."""
    sent = 0
    for t in transitions:
        context = contexts.get((t.xid, t.wid, t.eid))
        if context is None or not notify_when.matches(context.notify_when, t.new_state):
            continue
        # Keep the tracker in step, so a later observation does not re-send as "newly added".
        tracker.newly_added(context.uid, context.eid, context.notify_when)
        if t.new_state not in WorkUnitState.values:
            continue
        sent += publish(LifecycleEvent(
            xid=t.xid, wid=t.wid, eid=t.eid, old_state=t.old_state, new_state=t.new_state,
            event_time_ns=time.time_ns(), runtime=_runtime(context),
        ))
    return sent
