"""The guarded state machine of work unit executions, as pure functions.

Every rule of docs/architecture/state_machine.md that decides whether and how an execution's
status changes lives here, over plain data: no ORM, no clock reads (callers
pass ``now_ns``), no I/O. ``workunits.services.update_work_unit_executions``
applies these inside its transaction. The JobSet -> state table
(ToWorkUnitState) is the reconciler's: ``k8s_bridge.reconciler.mapping``.

Go names of the source system, for readers of the seeds:
``should_update_state`` = ShouldUpdateWorkUnitExecutionState,
``merge_execution`` = MergeWorkUnitExecution.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from workunits.choices import (
    INSERT_ONLY,
    PAUSE_ENTRY,
    RETAINING,
    TERMINAL,
    TIME_IGNORED,
    WorkUnitState,
    Writer,
)
from core.choices import SEVERITY_RANK
from core.errors import InvalidArgument

S = WorkUnitState

# --- Update masks -------------------------------------------------------------

STATE = "status.state"
SYSTEM_MESSAGE = "status.system_message"
USER_MESSAGE = "status.user_message"
SCHEDULING_INFORMATION = "status.scheduling_information"
DETAILED_STATUS = "status.detailed_status"
MLRUN_URL = "metadata.mlrun_url"

#: Every path a masked execution update may name. ``status.state`` carries
#: ``status.state_update_time`` implicitly.
MASK_PATHS: frozenset[str] = frozenset(
    {STATE, SYSTEM_MESSAGE, USER_MESSAGE, SCHEDULING_INFORMATION, DETAILED_STATUS, MLRUN_URL}
)

Message = Mapping[str, Any]  # a StructuredMessage as proto3 JSON

#: Every state name (``WorkUnitState.values`` rebuilds a list on each access).
STATE_NAMES: frozenset[str] = frozenset(S.values)


@dataclass(frozen=True)
class ExecutionUpdate:
    """One masked write to the current execution of ``(xid, wid)``.

    ``state_update_time_ns``: ``None`` means the field is missing (the whole
    batch is rejected when the mask names ``status.state``); ``0`` means a
    zero timestamp (the state change is dropped, other fields still merge).
    Message fields are proto3 JSON dicts; ``None`` clears a masked field.
    """

    xid: int
    wid: int
    eid: int
    mask: tuple[str, ...]
    state: str | None = None
    state_update_time_ns: int | None = None
    system_message: Message | None = None
    user_message: Message | None = None
    scheduling_information: Message | None = None
    detailed_status: Mapping[str, Any] | None = None
    mlrun_url: str = ""
    force_status_message_update: bool = False
    #: The messages explain this update's state change (a sweep repair): written only if it applies.
    messages_need_state: bool = False
    writer: str = Writer.RECONCILER
    request_id: str = ""
    operation_id: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, int]:
        return (self.xid, self.wid)


class ExecutionRecord(NamedTuple):
    """The status part of a stored execution, as the guards see it.

    A named tuple, not a frozen dataclass: the batch write builds one per
    execution read and one per update merged, and compares them, and a
    frozen dataclass's ``__init__`` and ``__eq__`` were a fifth of its CPU.
    """

    state: str
    state_update_time_ns: int
    system_message: Message | None = None
    user_message: Message | None = None
    scheduling_information: Message | None = None
    detailed_status: Mapping[str, Any] | None = None
    mlrun_url: str = ""
    complete_time_ns: int | None = None


class Merge(NamedTuple):
    """What ``merge_execution`` decided for one update (a named tuple, as `ExecutionRecord`)."""

    record: ExecutionRecord
    old_state: str
    new_state: str
    changed: bool
    #: ("system" | "user", message) for every message newly written.
    new_messages: tuple[tuple[str, Message], ...] = ()

    @property
    def state_changed(self) -> bool:
        return self.old_state != self.new_state


# --- Validation (before anything is written) ----------------------------------


def validate_update(update: ExecutionUpdate) -> None:
    """Raise ``InvalidArgument`` naming the field when ``update`` is malformed.

    A missing ``state_update_time`` with ``status.state`` in the mask fails
    here, which fails the whole batch before any row is touched.
    """
    if not update.mask:
        raise InvalidArgument("update_mask must name at least one path", field="update_mask")
    for path in update.mask:
        if path not in MASK_PATHS:
            raise InvalidArgument(
                f"update_mask path {path!r} is not updatable; allowed: {', '.join(sorted(MASK_PATHS))}",
                field="update_mask",
            )
    if update.xid <= 0 or update.wid <= 0 or update.eid <= 0:
        raise InvalidArgument(
            f"xid, wid and eid must be positive (got {update.xid}/{update.wid}/{update.eid})", field="eid"
        )
    if STATE in update.mask:
        if update.state not in STATE_NAMES:
            raise InvalidArgument(
                f"status.state {update.state!r} is not a work unit state", field="status.state"
            )
        if update.state_update_time_ns is None:
            raise InvalidArgument(
                "status.state_update_time is required when the update mask names status.state",
                field="status.state_update_time",
            )
        if update.state_update_time_ns < 0:
            raise InvalidArgument("status.state_update_time must not be negative", field="status.state_update_time")
    for path, message in ((SYSTEM_MESSAGE, update.system_message), (USER_MESSAGE, update.user_message)):
        if path in update.mask and message is not None and message.get("severity", "SEVERITY_UNSPECIFIED") not in SEVERITY_RANK:
            raise InvalidArgument(f"{path}.severity {message.get('severity')!r} is not a severity", field=path)


def validate_updates(updates: Iterable[ExecutionUpdate]) -> None:
    for update in updates:
        validate_update(update)


# --- Guards ---------------------------------------------------------------------


def is_fenced(update_eid: int, current_eid: int) -> bool:
    """EID fence: an update for any execution but the current one is skipped."""
    return update_eid != current_eid


def should_update_state(current_state: str, current_time_ns: int, new_state: str, new_time_ns: int) -> bool:
    """Whether a masked ``status.state`` write may change the state.

    ``False`` drops the state change silently (other masked fields still
    merge); it is never an error.
    """
    # Timestamp rules.
    if new_time_ns == 0:
        return False
    if new_time_ns < current_time_ns and new_state not in TIME_IGNORED:
        return False
    # Same state: nothing to change.
    if new_state == current_state:
        return False
    # Direction rules.
    if current_state in TERMINAL:
        return False
    if current_state == S.STOPPING and new_state not in TERMINAL:
        return False
    if new_state in INSERT_ONLY:
        return False
    if new_state == S.SCHEDULING_PAUSED and current_state not in PAUSE_ENTRY:
        return False
    return True


def severity_rank(message: Message | None) -> int:
    if not message:
        return -1
    return SEVERITY_RANK.get(str(message.get("severity", "SEVERITY_UNSPECIFIED")), 0)


def defers_to_existing(existing: Message | None, new: Message | None, force: bool) -> bool:
    """A new ERROR system message keeps an existing ERROR one unless forced."""
    return (
        not force
        and new is not None
        and existing is not None
        and new.get("severity") == "ERROR"
        and existing.get("severity") == "ERROR"
    )


def _same_message(a: Message | None, b: Message | None) -> bool:
    """Equal ignoring create time (a re-sent diagnostic is not a new message)."""
    if not a or not b:
        return not a and not b
    return _without_time(a) == _without_time(b)


def _without_time(message: Message) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "createTime"}


def merge_execution(current: ExecutionRecord, update: ExecutionUpdate, now_ns: int) -> Merge:
    """Apply the masked fields of ``update`` to ``current`` under every guard.

    The caller has already checked the EID fence and validated the update.
    """
    mask = update.mask
    old_state = current.state
    new_state, state_time, complete_time = old_state, current.state_update_time_ns, current.complete_time_ns

    if STATE in mask:
        assert update.state is not None and update.state_update_time_ns is not None
        if should_update_state(old_state, state_time, update.state, update.state_update_time_ns):
            new_state, state_time = update.state, update.state_update_time_ns

    system, user, scheduling = current.system_message, current.user_message, current.scheduling_information
    if new_state != old_state:
        # Messages describe the state they were written in; a move into a
        # retaining state keeps the diagnostic that preceded the stop/failure.
        if new_state not in RETAINING:
            system, user = None, None
        # Queue position and admission messages only mean something while SCHEDULING.
        if new_state != S.SCHEDULING:
            scheduling = None
        if new_state in TERMINAL and complete_time is None:
            complete_time = now_ns

    new_messages: list[tuple[str, Message]] = []
    if update.messages_need_state and new_state == old_state:
        mask = tuple(path for path in mask if path not in (SYSTEM_MESSAGE, USER_MESSAGE))
    if SYSTEM_MESSAGE in mask and not defers_to_existing(system, update.system_message, update.force_status_message_update):
        # A re-sent identical message (ignoring createTime) is no change: the
        # stored copy, with its server-stamped createTime, stays.
        if not update.system_message:
            system = None
        elif not _same_message(system, update.system_message):
            new_messages.append(("system", update.system_message))
            system = dict(update.system_message)
    if USER_MESSAGE in mask:
        if not update.user_message:
            user = None
        elif not _same_message(user, update.user_message):
            new_messages.append(("user", update.user_message))
            user = dict(update.user_message)
    if SCHEDULING_INFORMATION in mask:
        # Written only while SCHEDULING (STATES.md): a queue position that arrives
        # with, or after, a state change out of SCHEDULING (an older observation
        # whose state the guard refused, or an information-only update applied after
        # the move in the same batch) would otherwise outlive the state it explains.
        # Clearing is always accepted.
        if not update.scheduling_information:
            scheduling = None
        elif new_state == S.SCHEDULING:
            scheduling = dict(update.scheduling_information)
    detailed = current.detailed_status
    if DETAILED_STATUS in mask:
        detailed = dict(update.detailed_status) if update.detailed_status else None
    mlrun_url = update.mlrun_url if MLRUN_URL in mask else current.mlrun_url

    # One construction, positional (the batch write calls this for every
    # update: building records was its largest Python cost).
    record = ExecutionRecord(new_state, state_time, system, user, scheduling, detailed, mlrun_url, complete_time)
    return Merge(record, old_state, new_state, record != current, tuple(new_messages))


def best_severity(record: ExecutionRecord | None) -> str | None:
    """Severity name of the highest current message of an execution, if any."""
    if record is None or not (record.system_message or record.user_message):
        return None
    best = max((record.system_message, record.user_message), key=severity_rank)
    if not best:
        return None
    return str(best.get("severity", "SEVERITY_UNSPECIFIED"))
