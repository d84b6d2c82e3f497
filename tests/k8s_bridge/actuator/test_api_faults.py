"""The actuator rides through a misbehaving Kubernetes API (simulators.cluster.faults).

Errors (500, 503, 429 with Retry-After, 409), added latency, connections
dropped before a request and after it was served (the create happened, the
answer was lost): creates, stops and restarts all end done without an error
and every JobSet is created exactly once (the simulator counts creates).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import close_old_connections

from jobsets.contract import LABEL_EID
from tests import factories
from tests.k8s_bridge.actuator.conftest import Workers, get_jobset
from tests.k8s_bridge.actuator.test_crash_and_outage import FinalizerPath, _creates, _done
from tests.waiting import eventually
from workunits import services
from workunits.models import DeadLetter, Operation

pytestmark = pytest.mark.django_db(transaction=True)

FAULTS = {"seed": 22, "rules": [
    {"action": "error", "verb": "create", "resource": "jobsets", "status": 500, "rate": 0.25},
    {"action": "error", "verb": "create", "resource": "jobsets", "status": 409, "rate": 0.05},
    {"action": "drop_after", "verb": "create", "resource": "jobsets", "rate": 0.2},
    {"action": "error", "verb": "get", "resource": "jobsets", "status": 503, "rate": 0.1},
    {"action": "error", "verb": "get", "resource": "jobsets", "status": 429, "rate": 0.05, "retry_after": 1},
    {"action": "latency", "verb": "get", "resource": "jobsets", "rate": 0.1, "latency_s": 0.3},
    {"action": "error", "verb": "delete", "resource": "jobsets", "status": 500, "rate": 0.1},
    {"action": "drop", "verb": "delete", "resource": "jobsets", "rate": 0.1},
]}


@pytest.fixture
def faulty_api(api_cluster: Any) -> Iterator[Any]:
    api_cluster.faults.clear()
    api_cluster.faults.set(FAULTS)
    yield api_cluster.faults
    api_cluster.faults.clear()


def test_it_rides_creates_stops_and_restarts_through_api_faults(workers: Workers, api_cluster: Any, faulty_api: Any) -> None:
    workers.start(concurrency=2)
    exp = factories.experiment()
    with FinalizerPath(api_cluster):
        creates = [services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(20)]
        eventually(lambda: _done(creates) == 20, timeout=120, what="20 creates through the faults",
                   detail=workers.logs)
        ops = [services.stop_work_units(exp.id, [wid], batch=False).id for wid in range(1, 6)]
        ops += [services.restart_work_units(exp.id, [wid], batch=False).id for wid in range(6, 11)]
        eventually(lambda: _done(ops) == 10, timeout=120, what="stops and restarts through the faults",
                   detail=workers.logs)
        # A Stop is done once its delete was accepted; the JobSet itself goes when the
        # finalizer path (above, in the background) lets it go: wait for that, not a race.
        eventually(lambda: all(get_jobset(api_cluster, exp.id, wid) is None for wid in range(1, 6)),
                   timeout=30, what="the stopped JobSets let go by the finalizer path")
    close_old_connections()
    assert all(op.error is None for op in Operation.objects.filter(id__in=creates + ops))
    assert not DeadLetter.objects.exists()
    fired = {(r["action"], r["verb"], r["status"]): r["fired"] for r in faulty_api.snapshot()["rules"]}
    assert fired[("drop_after", "create", 500)] > 0 and fired[("error", "create", 500)] > 0, fired
    counts = _creates(api_cluster, exp.id)
    assert all(n == 1 for n in counts.values()), counts
    assert set(counts) == {(f"xmc-{exp.id}-{w}", "1") for w in range(1, 21)} | \
        {(f"xmc-{exp.id}-{w}", "2") for w in range(6, 11)}
    for wid in range(1, 6):
        assert get_jobset(api_cluster, exp.id, wid) is None
    for wid in range(6, 11):
        assert get_jobset(api_cluster, exp.id, wid)["metadata"]["labels"][LABEL_EID] == "2"
