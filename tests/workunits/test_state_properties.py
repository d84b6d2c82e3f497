"""Property-based tests: random sequences of writes from every writer.

Each example builds its own experiment and drives it with a random mix of
reconciler observations, user stops and restarts, pause-handler and
finalizer writes, enqueue failures and deliberately fenced updates, checking
the invariants of docs/architecture/state_machine.md after every step.
"""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from django.utils import timezone

from core import convert

from core.errors import FailedPrecondition
from experiments.models import Experiment
from tests import factories
from workunits import services, state
from workunits.choices import TERMINAL, WorkUnitState, Writer
from workunits.models import WorkUnit, WorkUnitExecution
from workunits.state import ExecutionUpdate
from workunits.wire import execution_record

pytestmark = pytest.mark.django_db

S = WorkUnitState
OBSERVED = [S.SCHEDULING, S.STARTING, S.RUNNING, S.PARTIALLY_FAILED, S.COMPLETED, S.FAILED]
ANY_STATE = list(S.values)

write = st.one_of(
    st.tuples(st.just("observe"), st.integers(0, 1), st.sampled_from(ANY_STATE), st.integers(-3, 3)),
    st.tuples(st.just("stop"), st.integers(0, 1)),
    st.tuples(st.just("restart"), st.integers(0, 1)),
    st.tuples(st.just("pause"), st.integers(0, 1)),
    st.tuples(st.just("finalize"), st.integers(0, 1), st.sampled_from([S.STOPPED, S.COMPLETED, S.FAILED])),
    st.tuples(st.just("message"), st.integers(0, 1), st.sampled_from(["INFO", "WARNING", "ERROR"])),
    st.tuples(st.just("fenced"), st.integers(0, 1), st.sampled_from(ANY_STATE)),
)


def snapshot(wu: WorkUnit) -> list[tuple]:
    return list(
        WorkUnitExecution.objects.filter(work_unit=wu).order_by("eid").values_list(
            "eid", "execution_state", "state", "state_update_time_ns", "system_message", "user_message"
        )
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(steps=st.lists(write, min_size=1, max_size=25))
def test_it_keeps_every_invariant_under_random_writes(steps) -> None:
    exp = factories.experiment()
    wus = [factories.work_unit(exp) for _ in range(2)]
    # Writers' clocks run ahead of the rows' insert times, as a reconciler's may.
    clock = [convert.ns_from_datetime(timezone.now()) + 10**12]
    terminal_seen: dict[tuple[int, int], str] = {}  # (wu.id, eid) -> terminal state

    def tick(delta: int = 1) -> int:
        clock[0] += 1_000
        return clock[0] + delta * 1_000_000

    for step in steps:
        kind, index = step[0], step[1]
        wu = WorkUnit.objects.get(id=wus[index].id)
        ex = WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid)
        before_state = ex.state
        if kind == "observe":
            new_state, skew = step[2], step[3]
            services.update_work_unit_executions([ExecutionUpdate(
                xid=exp.id, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE,), state=new_state,
                state_update_time_ns=tick(skew), writer=Writer.RECONCILER)])
        elif kind == "stop":
            try:
                services.stop_work_units(exp.id, [wu.wid], batch=False)
            except FailedPrecondition:
                assert before_state in TERMINAL
        elif kind == "restart":
            services.restart_work_units(exp.id, [wu.wid], batch=False)
        elif kind == "pause":
            services.update_work_unit_executions([ExecutionUpdate(
                xid=exp.id, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE, state.SYSTEM_MESSAGE),
                state=S.SCHEDULING_PAUSED, state_update_time_ns=tick(),
                system_message={"severity": "INFO", "userFacingText": "scheduling is paused"},
                writer=Writer.PAUSE_HANDLER)])
        elif kind == "finalize":
            services.update_work_unit_executions([ExecutionUpdate(
                xid=exp.id, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE,), state=step[2],
                state_update_time_ns=tick(), writer=Writer.FINALIZER)])
        elif kind == "message":
            services.update_work_unit_executions([ExecutionUpdate(
                xid=exp.id, wid=wu.wid, eid=wu.current_eid, mask=(state.SYSTEM_MESSAGE,),
                system_message={"severity": step[2], "userFacingText": f"{step[2]} {clock[0]}"})])
        elif kind == "fenced":
            before = snapshot(wu)
            transitions = services.update_work_unit_executions([ExecutionUpdate(
                xid=exp.id, wid=wu.wid, eid=wu.current_eid + 1, mask=(state.STATE, state.SYSTEM_MESSAGE),
                state=step[2], state_update_time_ns=tick(),
                system_message={"severity": "ERROR", "userFacingText": "from the future"})])
            if wu.current_eid > 1:
                services.update_work_unit_executions([ExecutionUpdate(
                    xid=exp.id, wid=wu.wid, eid=wu.current_eid - 1, mask=(state.STATE,), state=step[2],
                    state_update_time_ns=tick())])
            # A fenced update changes nothing.
            assert transitions == []
            assert snapshot(wu) == before

        after = WorkUnitExecution.objects.get(work_unit=wu, eid=ex.eid)
        # STOPPING is never overwritten by a non-terminal state.
        if before_state == S.STOPPING:
            assert after.state in TERMINAL | {S.STOPPING}
        # Exactly one ACTIVE execution per work unit, and it is the current one.
        for w in WorkUnit.objects.filter(experiment=exp):
            active = list(WorkUnitExecution.objects.filter(work_unit=w, execution_state="ACTIVE"))
            assert [a.eid for a in active] == [w.current_eid]
        # No execution leaves a terminal state.
        for e in WorkUnitExecution.objects.filter(work_unit__experiment=exp):
            key = (e.work_unit_id, e.eid)
            if key in terminal_seen:
                assert e.state == terminal_seen[key]
            elif e.state in TERMINAL:
                terminal_seen[key] = e.state
        # The roll-up equals the real counts.
        real = Counter(
            WorkUnitExecution.objects.filter(work_unit__experiment=exp, execution_state="ACTIVE")
            .values_list("state", flat=True)
        )
        assert Experiment.objects.get(id=exp.id).child_state_counts == dict(real)
        real_severities = Counter(
            s for s in (
                state.best_severity(execution_record(e))
                for e in WorkUnitExecution.objects.filter(work_unit__experiment=exp, execution_state="ACTIVE")
            ) if s
        )
        assert Experiment.objects.get(id=exp.id).message_severity_counts == dict(real_severities)
