"""A reconciler on ``cluster``: a running simulator (real HTTP API + controllers) with the real client
pointed at it (tests/fixtures/simulators.py).

Work units are created through the real services (real Postgres, committed:
the reconciler's threads use their own connections). JobSets are created in
the simulator through the kubernetes client in the shape the actuator's
builder produces (``xmc-<xid>-<wid>``, the xmc labels, the queue label, our
finalizer, ``spec.suspend: true``); every status the reconciler sees is
produced by the simulated controllers.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from k8s_bridge.reconciler.controller import Options, Reconciler
from tests.fixtures.simulators import Cluster as Cluster  # the fixture's class, re-exported for the tests here
from workunits.models import WorkUnit, WorkUnitExecution

NS = "default"


def execution(wu: WorkUnit, eid: int | None = None) -> WorkUnitExecution:
    wu.refresh_from_db()
    return WorkUnitExecution.objects.get(work_unit=wu, eid=eid or wu.current_eid)


def state_of(wu: WorkUnit, eid: int | None = None) -> str:
    return execution(wu, eid).state


@pytest.fixture
def make_reconciler(cluster: Cluster) -> Iterator[Callable[..., Reconciler]]:
    started: list[Reconciler] = []

    def make(start: bool = True, **kw: Any) -> Reconciler:
        options = Options(namespaces=(NS,), flush_interval_s=kw.pop("flush_interval_s", 0.05),
                          resync_s=kw.pop("resync_s", 300.0), grace_s=kw.pop("grace_s", 120.0),
                          position_refresh_s=kw.pop("position_refresh_s", 0.5), watch_timeout_s=5,
                          max_stopped_write_retry_age_s=kw.pop("max_stopped_write_retry_age_s", 600.0),
                          cluster_name=kw.pop("cluster_name", "sim"))
        rec = Reconciler(options, now=kw.pop("now", cluster.now), **kw)
        started.append(rec)
        if start:
            rec.start()
        return rec

    yield make
    for rec in started:
        rec.stop(drain=False)


@pytest.fixture
def reconciler(make_reconciler: Callable[..., Reconciler]) -> Reconciler:
    return make_reconciler()
