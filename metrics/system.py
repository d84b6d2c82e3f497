"""System metrics per execution: GPU, CPU and memory use from the cluster's Prometheus.

docs/architecture/system_metrics.md is the design. One :func:`collect` cycle
(the beat task ``xmc.metrics.collect_system`` every ``XMC_SYSTEM_METRICS_INTERVAL_S``):

1. the RUNNING current executions, from the database;
2. five PromQL instant queries at once at the cycle's instant ``t`` (the
   interval's start: every run within one interval asks the same question)
   over the pods of XMC's namespace whose name starts with a JobSet name XMC
   stamps (``xmc-<xid>-<wid>``, `jobsets.contract.jobset_name`): the DCGM
   exporter's GPU utilisation and memory used, cAdvisor's CPU rate, working
   set and memory limit; then, only for the executions that may be idle (every
   GPU below the threshold now, running for the idle window), the highest GPU
   utilisation over that window (the costly one: every sample of the window);
3. the pods joined to executions by that name; per execution the points
   `metrics.system_names` names (the mean utilisation 0-1 and one series per
   GPU, ``system/gpu_utilization/<replica>/gpu<n>``) at step "seconds since the
   execution was created" and time ``t``, written for every execution at once
   with `metrics.services.write_points_many` (a second run of a cycle asks
   about the same ``t``, makes the same steps and times, and adds nothing);
4. the advisories: GPUs all below ``XMC_IDLE_GPU_UTIL`` over the last
   ``XMC_IDLE_GPU_AFTER_S`` (and running that long), or a container's
   working set at ``XMC_MEMORY_NEAR_LIMIT`` of its limit, set as a WARNING and
   cleared when it no longer holds (`workunits.services.write_advisories`).
"""
from __future__ import annotations

import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from metrics import prometheus, system_names
from metrics.services import Point, write_points_many
from workunits import services as workunit_services
from workunits.choices import ExecutionState, WorkUnitState
from workunits.hooks import Advisory
from workunits.models import WorkUnitExecution

log = logging.getLogger(__name__)

MIB = 2**20
#: ``xmc-<xid>-<wid>-<replicated job>-<job index>-<pod index>-<random>``: the JobSet's pod names.
_POD = re.compile(r"^xmc-(\d+)-(\d+)-(.+?)(?:-[a-z0-9]{5})?$")
_ADVISORY = re.compile(r"^(\d+ GPUs? idle for |Memory near its limit)")


def pod_replica(pod: str) -> tuple[int, int, str] | None:
    """(xid, wid, replica) of a pod of an XMC JobSet (replica: its name without the JobSet's nor the random part)."""
    found = _POD.match(pod)
    return (int(found.group(1)), int(found.group(2)), found.group(3)) if found else None


def is_advisory(message: Mapping[str, Any] | None) -> bool:
    """A system message this collector wrote (so it may clear or replace it)."""
    return bool(message) and message.get("severity") == "WARNING" and bool(  # type: ignore[union-attr]
        _ADVISORY.match(str(message.get("userFacingText", ""))))  # type: ignore[union-attr]


def duration_text(seconds: float) -> str:
    return f"{round(seconds)} s" if seconds < 120 else f"{round(seconds / 60)} min"


def idle_text(gpus: int, after_s: float) -> str:
    return (f"{gpus} GPU{'s' if gpus != 1 else ''} idle for {duration_text(after_s)} "
            f"(below {settings.XMC_IDLE_GPU_UTIL:.0%} utilisation): is the job stuck, e.g. loading data?")


def _bytes_text(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / MIB:.0f} MiB"


def memory_text(container: str, limit: float) -> str:
    return (f"Memory near its limit: container {container} uses over {settings.XMC_MEMORY_NEAR_LIMIT:.0%} "
            f"of its {_bytes_text(limit)} limit; it may be OOMKilled")


@dataclass
class _Usage:
    """What the queries said of one execution's pods."""

    gpus: dict[tuple[str, str], float] = field(default_factory=dict)  # (replica, gpu) -> util 0-100
    fb_used_mib: float = 0.0
    cpu: float | None = None
    memory: float | None = None
    near_limit: tuple[str, float] | None = None  # (container, limit)
    window_max: float | None = None  # highest GPU utilisation (0-100) over the idle window


@dataclass
class Cycle:
    """What one collection did (the bench and the task's result read it)."""

    at: float = 0.0
    executions: int = 0
    measured: int = 0
    points: int = 0
    advisories: int = 0
    fetch_s: float = 0.0
    total_s: float = 0.0


def _selector(pods: str = "xmc-[0-9]+-[0-9]+-.+") -> str:
    """The series of XMC's namespace whose pod name matches ``pods`` (default: every XMC JobSet's)."""
    namespace = settings.XMC_K8S_NAMESPACE.replace("\\", "\\\\").replace('"', '\\"')
    return f'namespace="{namespace}",pod=~"{pods}"'


def queries(interval_s: float) -> dict[str, str]:
    """The PromQL every cycle asks, by what it measures (`window_query`: the idle window's, asked after).

    Each answer carries only the labels the join reads (``by (pod, gpu)``, ``by (pod, container)``): the
    exporters' others (UUID, model, host, instance, cgroup ids) would make the GPU answer, a series per
    GPU, five times the bytes to serialise, send and parse (3.3 MB against 0.7 MB for 8,000 GPUs). A
    series reported twice under other labels (two exporters of one GPU) counts once: the highest
    utilisation, the highest limit; the working sets still add up."""
    sel = _selector()
    rate = max(1, settings.XMC_PROMETHEUS_RATE_WINDOW_S)
    return {
        "util": f"max by (pod, gpu) (DCGM_FI_DEV_GPU_UTIL{{{sel}}})",
        "fb": f"sum by (pod) (DCGM_FI_DEV_FB_USED{{{sel}}})",
        "cpu": f'sum by (pod) (rate(container_cpu_usage_seconds_total{{{sel},container!=""}}[{rate}s]))',
        "memory": f'sum by (pod, container) (container_memory_working_set_bytes{{{sel},container!=""}})',
        "limit": f'max by (pod, container) (container_spec_memory_limit_bytes{{{sel},container!=""}} > 0)',
    }


def window_query(executions: Iterable[tuple[int, int]]) -> str:
    """The highest GPU utilisation over the idle window of each pod of these (xid, wid) (their JobSets' pods)."""
    sel = _selector("|".join(f"xmc-{xid}-{wid}-.+" for xid, wid in sorted(executions)))
    window = max(1, round(settings.XMC_IDLE_GPU_AFTER_S))
    return f"max by (pod) (max_over_time(DCGM_FI_DEV_GPU_UTIL{{{sel}}}[{window}s]))"


def fetch(at: float, interval_s: float) -> dict[str, list[prometheus.Sample]]:
    """Every query of the cycle at ``at``, all at once (a thread and a connection each): the cycle waits for
    the slowest query, not for their sum. The first failing query (in `queries`' order) raises."""
    asked = queries(interval_s)
    with ThreadPoolExecutor(max_workers=len(asked), thread_name_prefix="promql") as pool:
        futures = {what: pool.submit(prometheus.query, settings.XMC_PROMETHEUS_URL, promql, at=at,
                                     timeout=settings.XMC_PROMETHEUS_TIMEOUT_S)
                   for what, promql in asked.items()}
        return {what: future.result() for what, future in futures.items()}


def _join(results: dict[str, list[prometheus.Sample]], wanted: set[tuple[int, int]],
          usage: dict[tuple[int, int], _Usage] | None = None) -> dict[tuple[int, int], _Usage]:
    """The samples of ``results`` (by `queries`' names, and "window") of the pods of ``wanted``, by (xid, wid),
    added to ``usage`` (default: a new one)."""
    usage = defaultdict(_Usage) if usage is None else usage
    pods: dict[str, tuple[int, int, str] | None] = {}  # a pod's name is parsed once (a series per GPU, five queries)

    def each(what: str) -> Any:
        for sample in results.get(what, ()):
            pod = sample.labels.get("pod", "")
            key = pods[pod] if pod in pods else pods.setdefault(pod, pod_replica(pod))
            if key is not None and key[:2] in wanted:
                yield usage[key[:2]], key[2], sample

    for u, replica, s in each("util"):
        u.gpus[(replica, s.labels.get("gpu", "0"))] = s.value
    for u, _, s in each("fb"):
        u.fb_used_mib += s.value
    for u, _, s in each("cpu"):
        u.cpu = (u.cpu or 0.0) + s.value
    limits = {(s.labels.get("pod"), s.labels.get("container")): s.value for s in results.get("limit", ())}
    for u, _, s in each("memory"):
        u.memory = (u.memory or 0.0) + s.value
        limit = limits.get((s.labels.get("pod"), s.labels.get("container")))
        if limit and s.value >= settings.XMC_MEMORY_NEAR_LIMIT * limit:
            u.near_limit = (s.labels.get("container", ""), limit)
    for u, _, s in each("window"):
        u.window_max = s.value if u.window_max is None else max(u.window_max, s.value)
    return usage


def _points(u: _Usage, step: int, when: datetime) -> list[Point]:
    out = []
    if u.gpus:
        out.append(Point(system_names.GPU_UTILIZATION, step, sum(u.gpus.values()) / len(u.gpus) / 100.0, when))
        out += [Point(f"{system_names.GPU_UTILIZATION}/{replica}/gpu{gpu}", step, value / 100.0, when)
                for (replica, gpu), value in sorted(u.gpus.items())]
        out.append(Point(system_names.GPU_MEMORY_USED_BYTES, step, u.fb_used_mib * MIB, when))
    if u.cpu is not None:
        out.append(Point(system_names.CPU_USAGE_CORES, step, u.cpu, when))
    if u.memory is not None:
        out.append(Point(system_names.MEMORY_WORKING_SET_BYTES, step, u.memory, when))
    return out


def _may_be_idle(u: _Usage, running_for_s: float) -> bool:
    """Every GPU below the threshold now, running for the idle window: only then is the window asked about
    (the window's highest sample is at least the current one, when the current one is inside it)."""
    return (bool(u.gpus) and running_for_s >= settings.XMC_IDLE_GPU_AFTER_S
            and max(u.gpus.values()) < settings.XMC_IDLE_GPU_UTIL * 100)


def _advice(u: _Usage, running_for_s: float) -> tuple[str, str, dict[str, Any]]:
    """(kind, text, data) this execution should say now ("" text: nothing)."""
    if u.near_limit is not None:
        container, limit = u.near_limit
        return "memory", memory_text(container, limit), {"container": container, "limitBytes": limit}
    after = settings.XMC_IDLE_GPU_AFTER_S
    if (_may_be_idle(u, running_for_s) and u.window_max is not None
            and u.window_max < settings.XMC_IDLE_GPU_UTIL * 100):
        return "idle", idle_text(len(u.gpus), after), {"gpus": len(u.gpus), "idleSeconds": after,
                                                       "threshold": settings.XMC_IDLE_GPU_UTIL}
    return "", "", {}


#: The session-level advisory lock one cycle holds: a cycle that finds it taken (the previous one still
#: runs: a slow Prometheus, a loaded database) does nothing, so cycles never pile up behind each other.
_LOCK_KEY = 0x73797374656D  # "system"


def collect(now: datetime | None = None) -> Cycle:
    """One collection cycle (see the module docstring); a no-op without ``XMC_PROMETHEUS_URL`` or while
    another cycle runs."""
    if not settings.XMC_PROMETHEUS_URL:
        return Cycle()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_LOCK_KEY])
        if not cursor.fetchone()[0]:
            log.info("metrics.system.cycle_running")
            return Cycle()
    try:
        return _collect(now)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])


def _collect(now: datetime | None) -> Cycle:
    started = time.perf_counter()
    cycle = Cycle()
    interval = max(0.001, settings.XMC_SYSTEM_METRICS_INTERVAL_S)
    now_s = (now or timezone.now()).timestamp()
    at = math.floor(now_s / interval) * interval
    cycle.at = at
    running = list(WorkUnitExecution.objects.filter(execution_state=ExecutionState.ACTIVE, state=WorkUnitState.RUNNING)
                   .values_list("pk", "work_unit__experiment_id", "work_unit__wid", "eid", "create_time",
                                "state_update_time_ns", "system_message"))
    cycle.executions = len(running)
    if not running:
        cycle.total_s = time.perf_counter() - started
        return cycle
    fetch_started = time.perf_counter()
    results = fetch(at, interval)
    cycle.fetch_s = time.perf_counter() - fetch_started
    usage = _join(results, {(xid, wid) for _, xid, wid, *_ in running})
    suspects = {(xid, wid) for _, xid, wid, _, _, running_ns, _ in running
                if (xid, wid) in usage and _may_be_idle(usage[(xid, wid)], at - running_ns / 1e9)}
    if suspects:
        fetch_started = time.perf_counter()
        window = prometheus.query(settings.XMC_PROMETHEUS_URL, window_query(suspects), at=at,
                                  timeout=settings.XMC_PROMETHEUS_TIMEOUT_S)
        cycle.fetch_s += time.perf_counter() - fetch_started
        _join({"window": window}, suspects, usage)
    when = datetime.fromtimestamp(at, tz=UTC)
    since = when.isoformat().replace("+00:00", "Z")
    advice: list[Advisory] = []
    batches: list[tuple[int, list[Point]]] = []
    for pk, xid, wid, eid, created, running_ns, message in running:
        u = usage.get((xid, wid))
        if u is None:
            continue
        cycle.measured += 1
        batches.append((pk, _points(u, int(at - created.timestamp()), when)))
        kind, text, data = _advice(u, at - running_ns / 1e9)
        if text or is_advisory(message):
            if not (text and message and message.get("userFacingText") == text):
                advice.append(Advisory(xid, wid, eid, kind, text, since, data))
    cycle.points = write_points_many(batches)
    if advice:
        cycle.advisories = len(workunit_services.write_advisories(advice, is_advisory=is_advisory, now=when))
    cycle.total_s = time.perf_counter() - started
    return cycle
