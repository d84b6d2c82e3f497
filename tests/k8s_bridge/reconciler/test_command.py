"""manage.py reconcile --once, and the metrics endpoint."""
from __future__ import annotations

import io
import threading
import urllib.request

import pytest
from django.core.management import call_command

from k8s_bridge.reconciler import metrics
from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, state_of
from tests.waiting import eventually
from workunits import services
from workunits.choices import TaskType, WorkUnitState
from workunits.models import Operation

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState


def test_it_reconciles_and_sweeps_once_and_exits(cluster: Cluster) -> None:
    exp = factories.experiment()
    running, stopping = factories.work_unit(exp), factories.work_unit(exp)
    cluster.create_jobset(running, script="pull=1s;run=300s;exit=0")
    Operation.objects.filter(task_type=TaskType.CREATE).update(done=True)
    services.stop_work_units(exp.id, [stopping.wid], batch=False)
    eventually(lambda: (cluster.jobset(running) or {}).get("status", {}).get("replicatedJobsStatus", [{}])[0]
               .get("ready") == 1, what="the JobSet runs")
    out = io.StringIO()
    call_command("reconcile", "--once", stdout=out)
    assert "1 orphan repair" in out.getvalue()
    assert state_of(running) == S.RUNNING
    assert state_of(stopping) == S.STOPPED
    # Nothing of the run is left behind: no writer thread (each holds a database connection).
    assert [t.name for t in threading.enumerate() if t.name.startswith("xmc-writer")] == []


def test_it_serves_prometheus_metrics(cluster: Cluster, reconciler) -> None:
    port = metrics.serve(0)
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu)
    eventually(lambda: state_of(wu) != S.INITIALIZING, what="a flush")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for name in ("xmc_reconciler_events_total", "xmc_reconciler_flushes_total", "xmc_reconciler_batch_size",
                 "xmc_reconciler_write_seconds", "xmc_reconciler_update_outcomes_total", "xmc_reconciler_lag_seconds"):
        assert name in body
    assert 'xmc_reconciler_update_outcomes_total{outcome="applied"}' in body
