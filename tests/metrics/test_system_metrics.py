"""System metrics per execution from a real Prometheus scraping the simulator (issue 41 items 2-4).

A RUNNING execution of a work unit has pods on the simulator named as its JobSet's
(``xmc-<xid>-<wid>-...``) whose GPUs are busy, then idle, then busy again: the test
moves them to the next phase (the pods' live ``sim.xmc.dev/gpu`` annotation) once
it has seen the phase recorded, so a slow scrape or cycle delays the test and never
skips a phase; Debian's Prometheus scrapes the simulator's DCGM / cAdvisor text every
second. Each collection cycle (`metrics.system.collect`) records the execution's
``system/*`` series in the metric store, the idle WARNING appears once the GPUs
have stayed idle long enough (with a WORK_UNIT_IDLE event) and clears when they
work again; memory near its limit gets its own WARNING.
"""
from __future__ import annotations

from collections.abc import Iterator

from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from kubernetes import client

from metrics import system, system_names
from metrics.models import MetricPoint, MetricSummary
from notifications.models import Event, EventType, Scope, Subscription
from simulators.cluster.controllers.script import GPU_ANNOTATION
from simulators.cluster.server import SimulatorHandle
from tests import factories
from tests.metrics.prometheus import RealPrometheus, start_prometheus
from tests.notifications.helpers import set_state
from tests.waiting import eventually
from workunits.choices import WorkUnitState
from workunits.models import WorkUnit, WorkUnitExecution

pytestmark = pytest.mark.django_db(transaction=True)
#: module_simulator's (tests/fixtures/simulators.py): real time, as Prometheus scrapes it.
SIMULATOR_SPEED = 1.0


@pytest.fixture(scope="module")
def prometheus(module_simulator: SimulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealPrometheus]:
    yield from start_prometheus(module_simulator.url, tmp_path_factory.mktemp("prometheus"))


@pytest.fixture
def fast(settings: Any, prometheus: RealPrometheus) -> Any:
    settings.XMC_PROMETHEUS_URL = prometheus.url
    settings.XMC_SYSTEM_METRICS_INTERVAL_S = 1.0
    settings.XMC_IDLE_GPU_AFTER_S = 3.0
    settings.XMC_PROMETHEUS_RATE_WINDOW_S = 5
    settings.XMC_K8S_NAMESPACE = "default"
    return settings


def running_unit() -> WorkUnit:
    exp = factories.experiment()
    wu = factories.work_unit(exp)
    set_state([wu], WorkUnitState.RUNNING)
    return wu


def start_pods(module_simulator: SimulatorHandle, wu: WorkUnit, script: str, *, gpus: int = 2, replicas: int = 1,
               memory_limit: str = "8Gi") -> list[str]:
    names = []
    with client.ApiClient(client.Configuration(host=module_simulator.url)) as api:
        for i in range(replicas):
            name = f"xmc-{wu.experiment_id}-{wu.wid}-trainer-0-{i}-q{i}x7k"
            client.CoreV1Api(api).create_namespaced_pod("default", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"jobset.sigs.k8s.io/jobset-name": f"xmc-{wu.experiment_id}-{wu.wid}"},
                             "annotations": {"sim.xmc.dev/script": script}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "trainer:1",
                    "resources": {"requests": {"cpu": "2", "memory": "2Gi"},
                                  "limits": {"nvidia.com/gpu": str(gpus), "memory": memory_limit}}}]},
            })
            names.append(name)
    return names


def set_gpu_load(module_simulator: SimulatorHandle, pods: list[str], load: str) -> None:
    """From now on, the running ``pods``' GPUs are ``load`` busy (the simulator's ``sim.xmc.dev/gpu``)."""
    with client.ApiClient(client.Configuration(host=module_simulator.url)) as api:
        for name in pods:
            client.CoreV1Api(api).patch_namespaced_pod(name, "default", {"metadata": {"annotations": {
                GPU_ANNOTATION: load}}})


def execution(wu: WorkUnit) -> WorkUnitExecution:
    return WorkUnitExecution.objects.get(work_unit=wu, eid=wu.current_eid)


def collect_until(check: Any, *, timeout: float = 60.0, what: str) -> Any:
    """Run a collection cycle about once a second (as the beat would) until ``check()`` holds."""
    def cycle() -> Any:
        system.collect()
        return check()

    return eventually(cycle, timeout, what, interval=0.5)


def series(wu: WorkUnit, metric: str) -> list[tuple[int, float]]:
    return list(MetricPoint.objects.filter(execution=execution(wu), metric=metric).order_by("step")
                .values_list("step", "value"))


def test_it_gives_a_busy_then_idle_job_its_curve_an_idle_warning_and_a_notification(fast: Any, module_simulator: SimulatorHandle,
                                                                                 prometheus: RealPrometheus) -> None:
    wu = running_unit()
    Subscription.objects.create(owner=factories.ALICE, scope=Scope.MINE, events=[EventType.WORK_UNIT_IDLE],
                                url="https://hooks.example.com/x", channel="WEBHOOK", create_time=timezone.now(),
                                update_time=timezone.now())
    # Busy until the test has seen it, idle until the warning, then busy again.
    pods = start_pods(module_simulator, wu, "pull=0s;run=forever;gpu=util:0.9,mem:0.5", replicas=2)
    prometheus.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{pod=~"xmc-{wu.experiment_id}-{wu.wid}-.+"}}', what="the pods' GPUs scraped")

    collect_until(lambda: any(v >= 0.85 for _, v in series(wu, system_names.GPU_UTILIZATION)), what="a busy point")
    set_gpu_load(module_simulator, pods, "util:0,mem:0.5")
    message = collect_until(lambda: (execution(wu).system_message or {}).get("userFacingText", "").startswith(
        "4 GPUs idle for 3 s") and execution(wu).system_message, what="the idle warning")
    assert message["severity"] == "WARNING"
    curve = series(wu, system_names.GPU_UTILIZATION)
    assert max(v for _, v in curve) >= 0.85 and min(v for _, v in curve) == 0.0
    assert [s for s, _ in curve] == sorted({s for s, _ in curve})  # one point per cycle, steps in seconds
    per_gpu = MetricSummary.objects.filter(work_unit=wu, metric__startswith=system_names.GPU_UTILIZATION + "/")
    assert sorted(per_gpu.values_list("metric", flat=True)) == [
        f"{system_names.GPU_UTILIZATION}/trainer-0-{i}/gpu{g}" for i in range(2) for g in range(2)]
    assert series(wu, system_names.GPU_MEMORY_USED_BYTES)[-1][1] == pytest.approx(4 * 40960 * 0.5 * 2**20, rel=0.01)
    assert series(wu, system_names.MEMORY_WORKING_SET_BYTES)[-1][1] == 2 * 2**30  # half of 2Gi, two pods
    # Two pods at one core each, once the rate window holds enough of their counters' scrapes.
    collect_until(lambda: any(v == pytest.approx(2.0, rel=0.2) for _, v in series(wu, system_names.CPU_USAGE_CORES)),
                  what="the pods' CPU rate")

    (event,) = Event.objects.filter(type=EventType.WORK_UNIT_IDLE, xid=wu.experiment_id, wid=wu.wid)
    assert event.eid == wu.current_eid and event.data["gpus"] == 4

    set_gpu_load(module_simulator, pods, "util:0.8,mem:0.5")
    collect_until(lambda: execution(wu).system_message is None, what="the warning cleared once the GPUs work again")
    assert Event.objects.filter(type=EventType.WORK_UNIT_IDLE, xid=wu.experiment_id).count() == 1


def test_it_asks_the_idle_window_only_about_executions_whose_gpus_are_all_idle_now(
        fast: Any, module_simulator: SimulatorHandle, prometheus: RealPrometheus, monkeypatch: pytest.MonkeyPatch) -> None:
    busy, idle = running_unit(), running_unit()
    start_pods(module_simulator, busy, "pull=0s;run=forever;gpu=util:0.9", gpus=1)
    start_pods(module_simulator, idle, "pull=0s;run=forever;gpu=util:0", gpus=1)
    for wu in (busy, idle):
        prometheus.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{pod=~"xmc-{wu.experiment_id}-{wu.wid}-.+"}}')
    asked: list[str] = []
    query = system.prometheus.query

    def recording(url: str, promql: str, **kwargs: Any) -> Any:
        asked.append(promql)
        return query(url, promql, **kwargs)

    monkeypatch.setattr(system.prometheus, "query", recording)
    collect_until(lambda: execution(idle).system_message and series(busy, system_names.GPU_UTILIZATION),
                  what="the idle warning, and the busy unit measured")
    windows = [q for q in asked if "max_over_time" in q]
    assert windows and all(f"xmc-{idle.experiment_id}-{idle.wid}-.+" in q for q in windows)
    assert not any(f"xmc-{busy.experiment_id}-{busy.wid}-.+" in q for q in windows)  # its GPU works now
    assert execution(busy).system_message is None


def test_it_records_nothing_twice_when_a_cycle_runs_twice(fast: Any, module_simulator: SimulatorHandle, prometheus: RealPrometheus) -> None:
    wu = running_unit()
    start_pods(module_simulator, wu, "pull=0s;run=forever;gpu=util:0.5", gpus=1)
    prometheus.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{pod=~"xmc-{wu.experiment_id}-{wu.wid}-.+"}}')
    prometheus.wait_for(f'rate(container_cpu_usage_seconds_total{{pod=~"xmc-{wu.experiment_id}-{wu.wid}-.+"}}[5s])')

    def full_cycle() -> Any:  # an interval that starts after the pod's first scrapes sees every series
        now = timezone.now()
        done = system.collect(now)
        return (now, done) if done.points >= 4 else None

    now, first = eventually(full_cycle, 60, "a cycle with every series", interval=0.5)
    again = system.collect(now)  # the same interval: the same question, nothing new
    assert first.measured >= 1
    assert again.measured == first.measured and again.points == 0
    assert series(wu, system_names.GPU_UTILIZATION)[0][1] == 0.5


def test_it_warns_of_memory_near_its_limit_before_the_oom_kill(fast: Any, module_simulator: SimulatorHandle,
                                                                  prometheus: RealPrometheus) -> None:
    # The simulator's working set climbs from 50% of the limit to 98% over the run, then the kill:
    # a threshold of 60% (the product's setting; 90% by default) is crossed 6 s in, not 25 s.
    fast.XMC_MEMORY_NEAR_LIMIT = 0.6
    wu = running_unit()
    [pod] = start_pods(module_simulator, wu, "pull=0s;run=30s;exit=137;oom", gpus=1, memory_limit="1Gi")
    prometheus.wait_for(f'container_memory_working_set_bytes{{pod=~"xmc-{wu.experiment_id}-{wu.wid}-.+"}}')
    message = collect_until(lambda: execution(wu).system_message, what="the memory warning")
    assert message["userFacingText"].startswith("Memory near its limit: container main uses over 60% of its 1.0 GiB")
    with client.ApiClient(client.Configuration(host=module_simulator.url)) as api:  # before the kill, not after it
        assert client.CoreV1Api(api).read_namespaced_pod(pod, "default").status.phase == "Running"


def test_it_does_nothing_in_a_cycle_while_another_runs(fast: Any, module_simulator: SimulatorHandle) -> None:
    running_unit()
    other = connections.create_connection("default")  # another worker, in the middle of its cycle
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [system._LOCK_KEY])
        assert system.collect().executions == 0
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [system._LOCK_KEY])
        assert system.collect().executions >= 1  # its turn once the other is done
    finally:
        other.close()


def test_it_collects_nothing_without_a_prometheus_url(settings: Any) -> None:
    settings.XMC_PROMETHEUS_URL = ""
    running_unit()
    assert system.collect().executions == 0


def test_it_joins_a_pod_name_to_its_work_unit() -> None:
    assert system.pod_replica("xmc-12-3-trainer-0-1-x7k2q") == (12, 3, "trainer-0-1")
    assert system.pod_replica("xmc-12-3-worker-2-0") == (12, 3, "worker-2-0")
    assert system.pod_replica("other-12-3-a") is None


