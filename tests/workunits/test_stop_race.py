"""Stop racing the pause handler (issue 12): STOPPED is never dropped by the timestamp guard.

``stop_work_units`` reads the clock only once it holds the row locks and
stamps at least the stored ``state_update_time``; before, a pause-handler
write committed while the stop waited for the lock (or stamped by a host
whose clock runs ahead) made the guard drop STOPPED while the STOP operation
and its DELETE task still went out. Real Postgres, real threads.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from core import convert
from tests import factories
from workunits import services, state
from workunits.choices import ActionType, WorkUnitState, Writer
from workunits.models import Operation, WorkUnitExecution
from workunits.state import ExecutionUpdate

pytestmark = pytest.mark.django_db(transaction=True)

S = WorkUnitState
PAUSED_MESSAGE = {"severity": "INFO", "userFacingText": "scheduling is paused"}


def pause_update(wu, t_ns: int) -> ExecutionUpdate:
    return ExecutionUpdate(
        xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE, state.SYSTEM_MESSAGE),
        state=S.SCHEDULING_PAUSED, state_update_time_ns=t_ns, system_message=PAUSED_MESSAGE,
        writer=Writer.PAUSE_HANDLER,
    )


def current_state(wu) -> str:
    return WorkUnitExecution.objects.get(work_unit_id=wu.id, execution_state="ACTIVE").state


def wait_for_a_lock_waiter(deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # statistics are cached per transaction
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.02)
    raise AssertionError("the stop never waited for the row lock")


def test_it_stops_a_paused_work_unit_whose_pause_was_stamped_by_a_clock_ahead() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    ahead = convert.ns_from_datetime(timezone.now() + timedelta(hours=1))
    services.update_work_unit_executions([pause_update(wu, ahead)])
    assert current_state(wu) == S.SCHEDULING_PAUSED

    services.stop_work_units(exp.id, [wu.wid], batch=False)

    ex = WorkUnitExecution.objects.get(work_unit_id=wu.id, execution_state="ACTIVE")
    assert ex.state == S.STOPPED
    assert ex.state_update_time_ns >= ahead


def test_it_stops_a_work_unit_paused_while_the_stop_waited_for_its_lock() -> None:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    paused = threading.Event()
    errors: list[BaseException] = []

    def pause_handler() -> None:
        # Holds the work unit's row lock, as the pause handler's transaction
        # does, until the stop is queued behind it; then writes SCHEDULING_PAUSED
        # stamped with its own (later) clock and commits.
        try:
            with transaction.atomic():
                services.executions._lock_work_units([(exp.id, wu.wid)])
                wait_for_a_lock_waiter()
                services.executions._apply_updates([pause_update(wu, convert.ns_from_datetime(timezone.now()))], timezone.now())
            paused.set()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def stopper() -> None:
        try:
            services.stop_work_units(exp.id, [wu.wid], batch=False)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    handler = threading.Thread(target=pause_handler)
    handler.start()
    time.sleep(0.05)  # let the handler take the lock first (checked below: the stop waited)
    stop = threading.Thread(target=stopper)
    stop.start()
    handler.join(timeout=180)
    stop.join(timeout=180)
    assert not handler.is_alive() and not stop.is_alive()
    assert errors == []
    assert paused.is_set()

    assert current_state(wu) == S.STOPPED
    stop_op = Operation.objects.get(work_unit_id=wu.id, action_type=ActionType.STOP)
    assert stop_op.task_type == "DELETE"


def test_it_never_leaves_a_stopped_work_unit_paused_when_pause_and_stop_race() -> None:
    exp = factories.experiment()
    wus = [factories.work_unit(exp) for _ in range(6)]
    for wu in wus:
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def run(i: int, wu=wu, errors=errors, barrier=barrier) -> None:
            try:
                barrier.wait(timeout=60)
                if i == 0:
                    # The pause handler's host clock runs a little ahead.
                    ahead = convert.ns_from_datetime(timezone.now() + timedelta(seconds=30))
                    services.update_work_unit_executions([pause_update(wu, ahead)])
                else:
                    services.stop_work_units(exp.id, [wu.wid], batch=False)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert errors == []
        # Stop first: STOPPING (the pause is then refused); pause first: STOPPED.
        # Never SCHEDULING_PAUSED with a STOP operation out.
        assert current_state(wu) in (S.STOPPED, S.STOPPING), f"work unit {wu.wid}"
