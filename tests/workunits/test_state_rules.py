"""One test per rule of docs/architecture/state_machine.md that the pure guards in workunits.state own.

Each test is built so that removing its rule changes the outcome. Service-level
rules (batch failure, fencing on stored rows, history, roll-up) are in
test_update_executions.py.
"""
from __future__ import annotations

import itertools

import pytest

from core.errors import InvalidArgument
from k8s_bridge.reconciler.mapping import to_work_unit_state
from workunits import state
from workunits.choices import TERMINAL, WorkUnitState
from workunits.state import ExecutionRecord, ExecutionUpdate, merge_execution, should_update_state

S = WorkUnitState
T0 = 1_000_000_000_000
LATER = T0 + 5_000
EARLIER = T0 - 5_000
NOW = T0 + 10_000_000

ERROR = {"severity": "ERROR", "userFacingText": "image pull failed"}
ERROR2 = {"severity": "ERROR", "userFacingText": "could not enqueue"}
INFO = {"severity": "INFO", "userFacingText": "queued"}


def record(st: str = S.RUNNING, t: int = T0, **kw) -> ExecutionRecord:
    return ExecutionRecord(state=st, state_update_time_ns=t, **kw)


def upd(mask=(state.STATE,), st: str | None = None, t: int | None = LATER, **kw) -> ExecutionUpdate:
    return ExecutionUpdate(xid=1, wid=1, eid=1, mask=tuple(mask), state=st, state_update_time_ns=t, **kw)


# --- Rule: EID fence -----------------------------------------------------------------


def test_it_fences_an_update_for_an_execution_that_is_not_current() -> None:
    assert state.is_fenced(update_eid=1, current_eid=2)
    assert state.is_fenced(update_eid=3, current_eid=2)
    assert not state.is_fenced(update_eid=2, current_eid=2)


# --- Rule: timestamps ------------------------------------------------------------------


def test_it_rejects_a_state_update_without_state_update_time() -> None:
    with pytest.raises(InvalidArgument) as exc:
        state.validate_update(upd(st=S.RUNNING, t=None))
    assert exc.value.field == "status.state_update_time"


def test_it_accepts_a_message_update_without_state_update_time() -> None:
    state.validate_update(upd(mask=(state.SYSTEM_MESSAGE,), t=None, system_message=INFO))


def test_it_drops_a_state_change_with_a_zero_time_but_merges_other_fields() -> None:
    merge = merge_execution(
        record(S.SCHEDULING), upd(mask=(state.STATE, state.DETAILED_STATUS), st=S.RUNNING, t=0,
                                  detailed_status={"jobsetStatus": {"restarts": "1"}}), NOW
    )
    assert merge.new_state == S.SCHEDULING
    assert merge.record.detailed_status == {"jobsetStatus": {"restarts": "1"}}
    assert merge.changed


def test_it_drops_a_stale_state_change() -> None:
    assert not should_update_state(S.STARTING, T0, S.RUNNING, EARLIER)
    assert should_update_state(S.STARTING, T0, S.RUNNING, T0)  # equal time is not stale
    assert should_update_state(S.STARTING, T0, S.RUNNING, LATER)


def test_it_lets_stopping_ignore_the_clock() -> None:
    # A reconciler whose clock runs ahead wrote RUNNING "in the future":
    # the user's stop must still win.
    assert should_update_state(S.RUNNING, LATER, S.STOPPING, T0)


def test_it_applies_the_clock_to_other_user_writes() -> None:
    assert not should_update_state(S.RUNNING, LATER, S.COMPLETED, T0)


# --- Rule: direction --------------------------------------------------------------------


@pytest.mark.parametrize("current,new", itertools.product(sorted(TERMINAL), sorted(S.values)))
def test_it_never_leaves_a_terminal_state(current: str, new: str) -> None:
    assert not should_update_state(current, T0, new, LATER)


@pytest.mark.parametrize("new", sorted(set(S.values) - TERMINAL - {S.STOPPING}))
def test_it_moves_stopping_only_to_a_terminal_state(new: str) -> None:
    assert not should_update_state(S.STOPPING, T0, new, LATER)


@pytest.mark.parametrize("new", sorted(TERMINAL))
def test_it_lets_stopping_finish(new: str) -> None:
    assert should_update_state(S.STOPPING, T0, new, LATER)


@pytest.mark.parametrize(
    "current,new",
    [(c, n) for n in (S.INITIALIZING, S.RESTARTING)
     for c in (S.SCHEDULING, S.RUNNING, S.SCHEDULING_PAUSED, S.INITIALIZING, S.RESTARTING) if c != n],
)
def test_it_never_writes_insert_only_states_by_update(current: str, new: str) -> None:
    assert not should_update_state(current, T0, new, LATER)


@pytest.mark.parametrize("current", [S.SCHEDULING, S.STARTING, S.RUNNING, S.PARTIALLY_FAILED])
def test_it_enters_scheduling_paused_only_from_initializing_or_restarting(current: str) -> None:
    assert not should_update_state(current, T0, S.SCHEDULING_PAUSED, LATER)
    assert should_update_state(S.INITIALIZING, T0, S.SCHEDULING_PAUSED, LATER)
    assert should_update_state(S.RESTARTING, T0, S.SCHEDULING_PAUSED, LATER)


@pytest.mark.parametrize(
    "current,new",
    [(a, b) for a in (S.SCHEDULING, S.STARTING, S.RUNNING, S.PARTIALLY_FAILED)
     for b in (S.SCHEDULING, S.STARTING, S.RUNNING, S.PARTIALLY_FAILED) if a != b],
)
def test_it_allows_any_move_among_cluster_observed_states(current: str, new: str) -> None:
    # Preemption and JobSet-internal restarts go backwards.
    assert should_update_state(current, T0, new, LATER)


def test_it_lets_a_paused_execution_be_stopped_and_scheduled() -> None:
    assert should_update_state(S.SCHEDULING_PAUSED, T0, S.STOPPED, LATER)
    assert should_update_state(S.SCHEDULING_PAUSED, T0, S.SCHEDULING, LATER)


# --- Rule: same state --------------------------------------------------------------------


def test_it_makes_no_state_change_for_the_same_state_but_merges_other_fields() -> None:
    assert not should_update_state(S.RUNNING, T0, S.RUNNING, LATER)
    merge = merge_execution(
        record(S.RUNNING, system_message=INFO),
        upd(mask=(state.STATE, state.USER_MESSAGE), st=S.RUNNING, user_message=INFO), NOW,
    )
    assert not merge.state_changed
    assert merge.record.state_update_time_ns == T0  # the state's time is untouched
    assert merge.record.system_message == INFO  # no reset without a state change
    assert merge.record.user_message == INFO


# --- Rule: messages -----------------------------------------------------------------------


def test_it_resets_messages_on_a_state_change() -> None:
    merge = merge_execution(record(S.STARTING, system_message=ERROR, user_message=INFO), upd(st=S.RUNNING), NOW)
    assert merge.record.system_message is None
    assert merge.record.user_message is None


@pytest.mark.parametrize("new", [S.STOPPED, S.FAILED])
def test_it_retains_messages_when_entering_stopped_or_failed(new: str) -> None:
    merge = merge_execution(record(S.RUNNING, system_message=ERROR, user_message=INFO), upd(st=new), NOW)
    assert merge.record.system_message == ERROR
    assert merge.record.user_message == INFO


def test_it_does_not_retain_messages_when_completing() -> None:
    merge = merge_execution(record(S.RUNNING, system_message=ERROR), upd(st=S.COMPLETED), NOW)
    assert merge.record.system_message is None


def test_it_defers_a_new_error_message_to_an_existing_error() -> None:
    merge = merge_execution(
        record(S.RUNNING, system_message=ERROR), upd(mask=(state.SYSTEM_MESSAGE,), system_message=ERROR2), NOW
    )
    assert merge.record.system_message == ERROR
    assert not merge.new_messages


def test_it_replaces_an_existing_error_when_forced() -> None:
    merge = merge_execution(
        record(S.RUNNING, system_message=ERROR),
        upd(mask=(state.SYSTEM_MESSAGE,), system_message=ERROR2, force_status_message_update=True), NOW,
    )
    assert merge.record.system_message == ERROR2
    assert merge.new_messages == (("system", ERROR2),)


def test_it_writes_a_repairs_message_only_with_its_state() -> None:
    """A sweep repair's message explains its state change: it loses the race together with it."""
    repair = dict(mask=(state.STATE, state.SYSTEM_MESSAGE), st=S.FAILED, system_message=ERROR2,
                  force_status_message_update=True, messages_need_state=True)
    lost = merge_execution(record(S.STOPPED, system_message=INFO), upd(**repair), NOW)
    assert lost.record.state == S.STOPPED and lost.record.system_message == INFO and not lost.new_messages
    won = merge_execution(record(S.RUNNING, system_message=INFO), upd(**repair), NOW)
    assert won.record.state == S.FAILED and won.new_messages == (("system", ERROR2),)


def test_it_lets_an_error_replace_a_lower_severity_message() -> None:
    merge = merge_execution(
        record(S.RUNNING, system_message=INFO), upd(mask=(state.SYSTEM_MESSAGE,), system_message=ERROR), NOW
    )
    assert merge.record.system_message == ERROR


def test_it_reports_a_resent_message_as_not_new() -> None:
    merge = merge_execution(
        record(S.RUNNING, system_message={**INFO, "createTime": "2026-01-01T00:00:00Z"}),
        upd(mask=(state.SYSTEM_MESSAGE,), system_message=INFO), NOW,
    )
    assert merge.new_messages == ()


def test_it_clears_scheduling_information_when_leaving_scheduling() -> None:
    queued = {"severity": "INFO", "userFacingText": "position 3"}
    merge = merge_execution(record(S.SCHEDULING, scheduling_information=queued), upd(st=S.STARTING), NOW)
    assert merge.record.scheduling_information is None


def test_it_refuses_queue_information_for_an_execution_that_left_scheduling() -> None:
    queued = {"severity": "INFO", "userFacingText": "Queued in q (position 3 of 4)"}
    # An information-only update after the move out of SCHEDULING.
    late = merge_execution(record(S.RUNNING), upd(mask=(state.SCHEDULING_INFORMATION,), scheduling_information=queued), NOW)
    assert late.record.scheduling_information is None and not late.changed
    # An older observation (its SCHEDULING refused by the time guard) carrying a position.
    stale = merge_execution(record(S.RUNNING, t=LATER + 10),
                            upd(mask=(state.STATE, state.SCHEDULING_INFORMATION), st=S.SCHEDULING,
                                scheduling_information=queued), NOW)
    assert stale.record.state == S.RUNNING and stale.record.scheduling_information is None


def test_it_writes_and_clears_queue_information_while_scheduling() -> None:
    queued = {"severity": "INFO", "userFacingText": "Queued in q (position 3 of 4)"}
    merge = merge_execution(record(S.SCHEDULING), upd(mask=(state.SCHEDULING_INFORMATION,), scheduling_information=queued), NOW)
    assert merge.record.scheduling_information == queued
    entering = merge_execution(record(S.INITIALIZING), upd(mask=(state.STATE, state.SCHEDULING_INFORMATION), st=S.SCHEDULING,
                                                         scheduling_information=queued), NOW)
    assert entering.record.scheduling_information == queued
    cleared = merge_execution(record(S.RUNNING, scheduling_information=queued),
                              upd(mask=(state.SCHEDULING_INFORMATION,), scheduling_information=None), NOW)
    assert cleared.record.scheduling_information is None


# --- Rule: complete_time ---------------------------------------------------------------------


@pytest.mark.parametrize("new", sorted(TERMINAL))
def test_it_sets_complete_time_when_entering_a_terminal_state(new: str) -> None:
    merge = merge_execution(record(S.RUNNING), upd(st=new), NOW)
    assert merge.record.complete_time_ns == NOW


def test_it_does_not_set_complete_time_for_a_non_terminal_state() -> None:
    assert merge_execution(record(S.SCHEDULING), upd(st=S.RUNNING), NOW).record.complete_time_ns is None


# --- Validation: bad input names the field -------------------------------------------------------


@pytest.mark.parametrize(
    "update,field",
    [
        (upd(mask=("status.bogus",), st=S.RUNNING), "update_mask"),
        (upd(mask=(), st=S.RUNNING), "update_mask"),
        (upd(st="RUNNIN"), "status.state"),
        (upd(st=None), "status.state"),
        (ExecutionUpdate(xid=1, wid=1, eid=0, mask=(state.STATE,), state=S.RUNNING, state_update_time_ns=1), "eid"),
        (upd(mask=(state.SYSTEM_MESSAGE,), system_message={"severity": "LOUD"}), "status.system_message"),
    ],
)
def test_it_rejects_malformed_updates_naming_the_field(update: ExecutionUpdate, field: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        state.validate_update(update)
    assert exc.value.field == field
    assert field.split(".")[-1] in exc.value.message


# --- JobSet -> WorkUnitState mapping (one row per rule; each row would map
# differently if its rule were removed) --------------------------------------------------------------


def jobset(*, deleting=False, completed=False, failed=False, replicas=(2,), ready=0, active=0, succeeded=0,
           failed_jobs=0) -> dict:
    conditions = []
    if completed:
        conditions.append({"type": "Completed", "status": "True"})
    if failed:
        conditions.append({"type": "Failed", "status": "True"})
    return {
        "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {},
        "spec": {"replicatedJobs": [{"name": f"rj{i}", "replicas": r} for i, r in enumerate(replicas)]},
        "status": {
            "conditions": conditions,
            "replicatedJobsStatus": [
                {"name": "rj0", "ready": ready, "active": active, "succeeded": succeeded, "failed": failed_jobs}
            ],
        },
    }


@pytest.mark.parametrize(
    "rule,observed,expected",
    [
        ("1 deleting and completed", jobset(deleting=True, completed=True, ready=2), S.COMPLETED),
        ("1 deleting and failed", jobset(deleting=True, failed=True, ready=2), S.FAILED),
        ("1 deleting", jobset(deleting=True, ready=2), S.STOPPED),
        ("2 completed", jobset(completed=True, failed_jobs=1), S.COMPLETED),
        ("3 failed", jobset(failed=True, ready=2), S.FAILED),
        ("4 all ready", jobset(ready=2, active=2), S.RUNNING),
        ("4 ready plus succeeded", jobset(ready=1, succeeded=1, active=1), S.RUNNING),
        ("4 before 6: all ready although a job failed", jobset(failed_jobs=1, ready=2, active=2), S.RUNNING),
        ("5 active, not all ready", jobset(ready=1, active=2), S.STARTING),
        ("5 before 6: active although a job failed", jobset(failed_jobs=1, active=1), S.STARTING),
        ("6 failed and nothing active", jobset(failed_jobs=1), S.PARTIALLY_FAILED),
        ("6 before 7: failed and succeeded", jobset(failed_jobs=1, succeeded=1), S.PARTIALLY_FAILED),
        ("7 evicted after some succeeded", jobset(succeeded=1), S.RUNNING),
        ("8 nothing yet", jobset(), S.SCHEDULING),
        ("replicas come from the spec", jobset(replicas=(2, 2), ready=2, active=2), S.STARTING),
    ],
)
def test_it_maps_jobsets_to_work_unit_states(rule: str, observed: dict, expected: str) -> None:
    assert to_work_unit_state(observed) == expected, rule
