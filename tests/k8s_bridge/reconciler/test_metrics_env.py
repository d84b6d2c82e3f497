"""A job's metrics, end to end: the actuator's JobSet gives every container its metrics environment,
the container's token writes points over HTTP while the execution runs, and stops working once it
ended plus the grace.

The actuator's create task runs in-process (the code a worker runs) against the simulator, whose
controllers start the pods; the reconciler writes the states; the web service is pytest-django's
live server, reached at ``XMC_METRICS_URL`` as a pod would.
"""
from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

import pytest

from core import task_wire
from k8s_bridge import client, tasks
from metrics.models import MetricPoint, MetricSummary
from tests import factories
from tests.k8s_bridge.reconciler.conftest import NS, Cluster, state_of
from tests.waiting import eventually
from workunits import outbox
from workunits.choices import WorkUnitState
from workunits.models import Operation

pytestmark = pytest.mark.django_db(transaction=True)


def _create_jobset(op: Operation) -> None:
    task = outbox.build_task(op)
    task_wire.sign(task)
    result = tasks.create.apply(args=[task_wire.encode_task(task)])
    assert not result.failed(), result.result


def _container_env(xid: int, wid: int) -> dict[str, str] | None:
    pods = client.core().list_namespaced_pod(NS, label_selector=f"jobset.sigs.k8s.io/jobset-name=xmc-{xid}-{wid}").items
    if not pods:
        return None
    pod = pods[0].to_dict()
    containers = pod["spec"]["containers"] + (pod["spec"].get("init_containers") or [])
    envs = [{var["name"]: var.get("value") for var in c.get("env") or []} for c in containers]
    assert all(env == envs[0] for env in envs[1:]) or len(envs) == 1
    return envs[0]


def _write(env: dict[str, str], step: int) -> int:
    url = f"{env['XMC_METRICS_URL']}/v1/experiments/{env['XMC_XID']}/workUnits/{env['XMC_WID']}/metrics:write"
    body = json.dumps({"points": [{"metric": "loss", "step": step, "value": 1.0 / (step + 1)}]}).encode()
    request = urllib.request.Request(url, body, method="POST", headers={
        "Authorization": f"Bearer {env['XMC_METRICS_TOKEN']}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_it_gives_a_container_its_metrics_env_and_a_token_that_writes_until_the_execution_ended(
        cluster: Cluster, reconciler: Any, live_server: Any, settings: Any) -> None:
    settings.XMC_METRICS_URL = live_server.url
    settings.XMC_METRICS_TOKEN_GRACE_S = 1.0
    exp = factories.experiment()
    wu = factories.work_unit(exp, annotations={"sim.xmc.dev/script": "pull=1s;run=60s;exit=0"})
    _create_jobset(Operation.objects.get(work_unit=wu, action_type="CREATE"))

    env = eventually(lambda: _container_env(exp.id, wu.wid), what="the pod with its env")
    assert (env["XMC_METRICS_URL"], env["XMC_XID"], env["XMC_WID"], env["XMC_EID"]) == (
        live_server.url, str(exp.id), str(wu.wid), "1")
    assert env["XMC_METRICS_TOKEN"].startswith("xmcm1.")

    eventually(lambda: state_of(wu) == WorkUnitState.RUNNING, what="RUNNING")
    assert [_write(env, step) for step in range(3)] == [200, 200, 200]
    assert _write(env, 0) == 200  # a replay: nothing doubled
    assert sorted(MetricPoint.objects.values_list("step", flat=True)) == [0, 1, 2]

    # The job completes: the execution ends, and once the grace is over the token no longer writes.
    eventually(lambda: state_of(wu) == WorkUnitState.COMPLETED, timeout=90, what="COMPLETED")
    eventually(lambda: _write(env, 100) == 403, timeout=60, what="the token refused after the grace")


def test_it_reports_a_scripted_pods_curve_through_the_write_path(
        cluster: Cluster, reconciler: Any, live_server: Any, settings: Any) -> None:
    """``metrics=every:1s:loss=exp(-t/30)``: the simulated container writes with its own token."""
    settings.XMC_METRICS_URL = live_server.url
    exp = factories.experiment()
    wu = factories.work_unit(exp, annotations={
        "sim.xmc.dev/script": "pull=1s;run=20s;exit=0;metrics=every:1s:loss=exp(-t/30),acc=1-exp(-t/20)"})
    _create_jobset(Operation.objects.get(work_unit=wu, action_type="CREATE"))
    eventually(lambda: state_of(wu) == WorkUnitState.COMPLETED, timeout=90, what="COMPLETED")
    eventually(lambda: MetricPoint.objects.filter(metric="loss").count() >= 19, timeout=30, what="the curve")
    loss = dict(MetricPoint.objects.filter(metric="loss").values_list("step", "value"))
    assert set(loss) <= set(range(1, 21)) and 1 in loss
    for step, value in loss.items():
        assert value == pytest.approx(math.exp(-step / 30))
    assert MetricPoint.objects.filter(metric="acc").count() == len(loss)
    # The simulator's points keep the summary too: last value at the highest step, min, max, count.
    summary = MetricSummary.objects.get(work_unit=wu, eid=1, metric="loss")
    assert (summary.last_step, summary.count) == (max(loss), len(loss))
    assert (summary.last, summary.min, summary.max) == (loss[max(loss)], min(loss.values()), max(loss.values()))
