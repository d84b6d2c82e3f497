"""The reconciler rides through a misbehaving Kubernetes API (simulators.cluster.faults).

Watches closed mid-stream, 410 Gone on resume, lists failing with 503 and
429, finalizer patches failing with 409/500, added latency: every work unit
still reaches its true terminal state, the finalizer path still lets a
stopped JobSet go, and no execution's history goes backwards.
"""
from __future__ import annotations

from typing import Any

import pytest

from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, state_of
from tests.k8s_bridge.reconciler.test_end_to_end import history
from tests.waiting import eventually
from workunits import services
from workunits.choices import WorkUnitState

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState

#: The order states may be written in (a later one never before an earlier one).
ORDER = [S.INITIALIZING, S.SCHEDULING, S.STARTING, S.RUNNING, S.STOPPING, S.COMPLETED, S.FAILED, S.STOPPED]

FAULTS = {"seed": 5, "rules": [
    {"action": "watch_close", "verb": "watch", "resource": "*", "rate": 0.5, "after_events": 2},
    {"action": "gone", "verb": "watch", "resource": "*", "rate": 0.3},
    {"action": "error", "verb": "list", "resource": "*", "status": 503, "rate": 0.2},
    {"action": "error", "verb": "list", "resource": "*", "status": 429, "rate": 0.1, "retry_after": 1},
    {"action": "latency", "verb": "list", "resource": "*", "rate": 0.2, "latency_s": 0.2},
    {"action": "error", "verb": "patch", "resource": "jobsets", "status": 409, "rate": 0.2},
    {"action": "error", "verb": "patch", "resource": "jobsets", "status": 500, "rate": 0.1},
]}


def test_it_rides_through_watch_closes_gone_and_failing_lists(cluster: Cluster, make_reconciler: Any) -> None:
    exp = factories.experiment()
    done = [factories.work_unit(exp) for _ in range(3)]
    stopped = factories.work_unit(exp)
    cluster.handle.faults.set(FAULTS)
    try:
        make_reconciler(resync_s=5.0)
        for wu in done:
            cluster.create_jobset(wu, script="pull=1s;run=3s;exit=0")
        cluster.create_jobset(stopped, script="pull=1s;run=300s;exit=0")
        eventually(lambda: state_of(stopped) == S.RUNNING, timeout=90, what="RUNNING through the faults")
        services.stop_work_units(exp.id, [stopped.wid], batch=False)
        cluster.delete_jobset(stopped)  # what the actuator's Delete does
        for wu in done:
            eventually(lambda wu=wu: state_of(wu) == S.COMPLETED, timeout=90, what="COMPLETED through the faults")
        eventually(lambda: state_of(stopped) == S.STOPPED, timeout=90, what="STOPPED through the faults")
        eventually(lambda: cluster.handle.store.list("jobsets", "default")[0] == [] or
                   cluster.jobset(stopped) is None, timeout=60, what="the finalizer let the JobSet go")
    finally:
        fired = {(r["action"], r["verb"], r["status"]): r["fired"] for r in cluster.handle.faults.snapshot()["rules"]}
        cluster.handle.faults.clear()
    assert fired[("watch_close", "watch", 500)] > 0 and fired[("gone", "watch", 500)] > 0, fired
    # Which list error a failing list got is the draw's (rules are tried in order per request):
    # that lists failed at all is what the test needs.
    assert fired[("error", "list", 503)] + fired[("error", "list", 429)] > 0, fired
    for wu in [*done, stopped]:
        states = history(wu)
        assert states == sorted(states, key=ORDER.index), states  # never backwards
