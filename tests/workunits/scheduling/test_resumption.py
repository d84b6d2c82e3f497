"""Resumption: every skip rule with its recorded reason, re-signed re-sends, order, clean-up.

What is re-sent is read back from the real Redis broker (this run's database).
"""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from core import convert, task_wire
from k8s_bridge.actuator.pause import hold_if_paused, release
from tests import factories
from tests.workunits.scheduling.conftest import OLIVIA, actuator_messages, queue_messages, task_for
from workunits import resumption, scheduling, services, state
from workunits.models import PausedTask, WorkUnit
from workunits.resumption import SkipReason

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _paused(broker) -> None:
    scheduling.pause(reason="upgrade", by=OLIVIA)


def hold(wu: WorkUnit, kind: str, **kw) -> PausedTask:
    assert hold_if_paused(task_for(wu, kind, **kw)) is True
    release()
    return PausedTask.objects.latest("id")


def resume_inline(batch_size: int = 100) -> resumption.RunSummary:
    result = scheduling.resume(by=OLIVIA, batch_size=batch_size, dispatch=False)
    return resumption.run(result.run_id, batch_size=batch_size)


def observe(wu: WorkUnit, new_state: str) -> None:
    """The reconciler saw the JobSet in ``new_state``."""
    wu.refresh_from_db()
    services.update_work_unit_executions([state.ExecutionUpdate(
        xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE,), state=new_state,
        state_update_time_ns=convert.ns_from_datetime(timezone.now()),
    )])


def outcome(row: PausedTask) -> tuple[str, str]:
    row.refresh_from_db()
    return row.resolution_status, row.skip_reason


def test_it_resends_a_held_create_re_signed_with_a_fresh_expiry(broker) -> None:
    wu = factories.work_unit(factories.experiment())
    row = hold(wu, "CREATE")
    stored = task_wire.decode(bytes(row.payload))
    summary = resume_inline()
    assert (summary.resumed, summary.skipped) == (1, 0)
    assert outcome(row) == ("RESUMED", "")
    row.refresh_from_db()
    assert row.processed_time is not None and row.resumption_run_id == summary.run_id
    [(name, sent)] = actuator_messages(broker)
    assert name == "xmc.actuator.create"
    task_wire.verify(sent)
    assert sent.expire_time_ns >= stored.expire_time_ns and sent.signature != b""
    assert (sent.xid, sent.wid, sent.eid, sent.operation_name) == (stored.xid, stored.wid, stored.eid,
                                                                    stored.operation_name)


def test_it_skips_a_task_whose_execution_was_superseded(broker) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    row = hold(wu, "CREATE")
    services.restart_work_units(exp.id, [wu.wid], batch=False)  # current eid 2 > task eid 1
    restart = hold(wu, "RESTART")  # for eid 2 (= target 1 + 1): still current
    resume_inline()
    assert outcome(row) == ("SKIPPED", SkipReason.SUPERSEDED_EXECUTION)
    assert outcome(restart) == ("RESUMED", "")
    assert [name for name, _ in actuator_messages(broker)] == ["xmc.actuator.restart"]


def test_it_skips_a_restart_superseded_by_a_later_restart(broker) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    services.restart_work_units(exp.id, [wu.wid], batch=False)
    first = hold(wu, "RESTART")  # eid 2
    services.restart_work_units(exp.id, [wu.wid], batch=False)
    second = hold(wu, "RESTART")  # eid 3
    resume_inline()
    assert outcome(first) == ("SKIPPED", SkipReason.SUPERSEDED_EXECUTION)
    assert outcome(second) == ("RESUMED", "")


@pytest.mark.parametrize(("final", "reason"), [
    ("STOPPING", SkipReason.WORK_UNIT_STOPPING),
    ("STOPPED", SkipReason.WORK_UNIT_STOPPED),
    ("COMPLETED", SkipReason.WORK_UNIT_COMPLETED),
    ("FAILED", SkipReason.WORK_UNIT_FAILED),
])
def test_it_skips_a_task_whose_work_unit_is_finished(broker, final: str, reason: str) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    scheduling.resume(by=OLIVIA, dispatch=False)
    observe(wu, "RUNNING")  # created before the pause
    scheduling.pause(reason="upgrade", by=OLIVIA)
    row = hold(wu, "UPDATE")
    if final in ("STOPPING", "STOPPED"):
        services.stop_work_units(exp.id, [wu.wid], batch=False)
    if final != "STOPPING":
        observe(wu, final)
    resume_inline()
    assert outcome(row) == ("SKIPPED", reason)
    assert actuator_messages(broker) == []


def test_it_stops_a_paused_work_unit_for_good(broker) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    row = hold(wu, "CREATE")
    services.stop_work_units(exp.id, [wu.wid], batch=False)  # SCHEDULING_PAUSED -> STOPPED
    resume_inline()
    assert outcome(row) == ("SKIPPED", SkipReason.WORK_UNIT_STOPPED)
    assert actuator_messages(broker) == []


def test_it_sends_only_the_newest_of_several_updates(broker) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    scheduling.resume(by=OLIVIA, dispatch=False)
    observe(wu, "RUNNING")
    scheduling.pause(reason="upgrade", by=OLIVIA)
    older = hold(wu, "UPDATE", notify_when="RUNNING")
    newer = hold(wu, "UPDATE", notify_when="RUNNING.COMPLETED")
    resume_inline(batch_size=1)  # the newer one is in a later batch: it still wins
    assert outcome(older) == ("SKIPPED", SkipReason.UPDATE_SUPERSEDED)
    assert outcome(newer) == ("RESUMED", "")
    [(name, sent)] = actuator_messages(broker)
    assert (name, sent.notify_when) == ("xmc.actuator.update", "RUNNING.COMPLETED")


def test_it_skips_an_update_while_the_work_unit_has_no_jobset_yet(broker) -> None:
    wu = factories.work_unit(factories.experiment())
    create = hold(wu, "CREATE")  # SCHEDULING_PAUSED
    update = hold(wu, "UPDATE")
    resume_inline()
    assert outcome(create) == ("RESUMED", "")
    assert outcome(update) == ("SKIPPED", SkipReason.UPDATE_BEFORE_JOBSET)
    # The Create carries the current notify-when instead (workunits.hooks.notify_when_for).
    assert [name for name, _ in actuator_messages(broker)] == ["xmc.actuator.create"]


def test_it_skips_a_task_whose_work_unit_is_gone(broker) -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    row = hold(wu, "CREATE")
    exp.delete()
    resume_inline()
    assert outcome(row) == ("SKIPPED", SkipReason.WORK_UNIT_GONE)


def test_it_skips_a_payload_that_does_not_parse(broker) -> None:
    wu = factories.work_unit(factories.experiment())
    row = hold(wu, "CREATE")
    PausedTask.objects.filter(id=row.id).update(payload=b"\xff\xff not a task")
    resume_inline()
    assert outcome(row) == ("SKIPPED", SkipReason.INVALID_PAYLOAD)


def test_it_resends_oldest_first_across_batches(broker) -> None:
    exp = factories.experiment()
    work_units = [factories.work_unit(exp) for _ in range(5)]
    for wu in reversed(work_units):
        hold(wu, "CREATE")
    summary = resume_inline(batch_size=2)
    assert summary.resumed == 5
    sent = [t.wid for _, t in actuator_messages(broker)]
    # Batches go oldest first; inside a batch, work units are sent concurrently.
    assert [set(sent[0:2]), set(sent[2:4]), sent[4:]] == [{5, 4}, {3, 2}, [1]]


def test_it_stops_when_scheduling_is_paused_again(broker) -> None:
    exp = factories.experiment()
    for _ in range(3):
        hold(factories.work_unit(exp), "CREATE")
    result = scheduling.resume(by=OLIVIA, dispatch=False)
    summary = resumption.RunSummary(run_id=result.run_id)
    assert resumption.run_batch(result.run_id, 1, summary) == 1
    scheduling.pause(reason="again", by=OLIVIA)
    assert resumption.run_batch(result.run_id, 1, summary) == 0
    assert summary.interrupted
    assert PausedTask.objects.filter(processed_time__isnull=True).count() == 2


def test_it_rolls_a_batch_back_when_the_broker_refuses(broker, monkeypatch) -> None:
    wu = factories.work_unit(factories.experiment())
    row = hold(wu, "CREATE")

    def broker_down(task) -> None:
        raise ConnectionError("redis is down")

    monkeypatch.setattr("workunits.outbox.publish", broker_down)
    with pytest.raises(ConnectionError):
        resume_inline()
    assert outcome(row) == ("", "")  # still waiting for the next run
    monkeypatch.undo()
    assert resumption.run(uuid.uuid4(), batch_size=10).resumed == 1


def test_it_deletes_processed_rows_seven_days_after_processing(broker) -> None:
    exp = factories.experiment()
    old, recent, pending = (hold(factories.work_unit(exp), "CREATE") for _ in range(3))
    now = timezone.now()
    PausedTask.objects.filter(id=old.id).update(processed_time=now - timedelta(days=7, seconds=1),
                                                resolution_status="RESUMED")
    PausedTask.objects.filter(id=recent.id).update(processed_time=now - timedelta(days=6, hours=23),
                                                   resolution_status="SKIPPED")
    assert resumption.delete_expired(now=now) == 1
    assert set(PausedTask.objects.values_list("id", flat=True)) == {recent.id, pending.id}


def test_it_dispatches_the_run_to_the_resumption_queue(broker, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        result = scheduling.resume(by=OLIVIA, batch_size=50)
    [message] = queue_messages(broker, "resumption")
    assert message == {"task": "xmc.resumption.run", "args": [str(result.run_id), 50]}


def test_it_keeps_the_skip_rules_pure() -> None:
    rule = resumption.skip_reason
    assert rule(task_type="CREATE", task_eid=1, current_eid=None, current_state=None, newer_update=False) \
        == SkipReason.WORK_UNIT_GONE
    assert rule(task_type="RESTART", task_eid=2, current_eid=2, current_state="SCHEDULING_PAUSED",
                newer_update=False) is None
    assert rule(task_type="RESTART", task_eid=2, current_eid=3, current_state="RESTARTING",
                newer_update=False) == SkipReason.SUPERSEDED_EXECUTION
    assert rule(task_type="UPDATE", task_eid=1, current_eid=1, current_state="RUNNING", newer_update=False) is None


def test_it_schedules_the_clean_up_with_beat() -> None:
    from xmc.celery import app

    app.loader.import_default_modules()  # what a worker or beat does at start (autodiscovery)
    entry = app.conf.beat_schedule["paused-task-cleanup"]
    assert entry["task"] in app.tasks and entry["options"]["queue"] == "resumption"
    assert app.tasks["xmc.resumption.run"].queue == "resumption"
