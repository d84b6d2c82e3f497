"""A running simulator (real HTTP API + controllers), the real client pointed at it, and a reconciler.

Work units are created through the real services (real Postgres, committed:
the reconciler's threads use their own connections). JobSets are created in
the simulator through the kubernetes client in the shape the actuator's
builder produces (``xmc-<xid>-<wid>``, the xmc labels, the queue label, our
finalizer, ``spec.suspend: true``); every status the reconciler sees is
produced by the simulated controllers.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from k8s_bridge import client
from k8s_bridge.reconciler import mapping
from k8s_bridge.reconciler.controller import Options, Reconciler
from simulators.cluster.server import SimulatorHandle
from workunits.models import WorkUnit, WorkUnitExecution

NS = "default"
SPEED = 10.0


class Cluster:
    def __init__(self, handle: SimulatorHandle) -> None:
        self.handle = handle

    def now(self) -> datetime:
        """The simulator's clock (condition timestamps are taken from it)."""
        return datetime.fromtimestamp(self.handle.clock.now(), tz=timezone.utc)

    # --- JobSets shaped like the actuator's builder ------------------------------------------

    def create_jobset(self, wu: WorkUnit, eid: int | None = None, *, script: str = "pull=1s;run=5s;exit=0",
                      replicas: int = 1, pods: int = 1, queue: str = "cpu-queue", cpu: str = "1",
                      priority_class: str | None = None, failure_policy: dict[str, Any] | None = None,
                      image: str = "busybox:1.36", backoff_limit: int = 0,
                      extra_jobs: dict[str, str] | None = None, success_policy: dict[str, Any] | None = None,
                      restart_policy: str = "Never", active_deadline_s: int | None = None,
                      ) -> dict[str, Any]:
        wu.refresh_from_db()
        eid = eid or wu.current_eid
        container: dict[str, Any] = {"name": "main", "image": image, "resources": {"requests": {"cpu": cpu}}}
        pod_spec: dict[str, Any] = {"containers": [container], "restartPolicy": restart_policy}
        if priority_class:
            pod_spec["priorityClassName"] = priority_class
        labels = {
            mapping.XID_LABEL: str(wu.experiment_id), mapping.WID_LABEL: str(wu.wid),
            mapping.EID_LABEL: str(eid), "xmc.google.com/last-edit": str(time.time_ns()),
            mapping.QUEUE_LABEL: queue,
        }
        if priority_class:
            labels["kueue.x-k8s.io/priority-class"] = priority_class
        def rjob(name: str, script: str, replicas: int) -> dict[str, Any]:
            job_spec: dict[str, Any] = {
                "parallelism": pods, "completions": pods, "backoffLimit": backoff_limit,
                "template": {"metadata": {"annotations": {"sim.xmc.dev/script": script}}, "spec": pod_spec},
            }
            if active_deadline_s is not None:
                job_spec["activeDeadlineSeconds"] = active_deadline_s
            return {"name": name, "replicas": replicas, "template": {"spec": job_spec}}

        spec: dict[str, Any] = {
            "suspend": True,
            "replicatedJobs": [rjob("main", script, replicas),
                               *(rjob(n, sc, 1) for n, sc in (extra_jobs or {}).items())],
        }
        if success_policy is not None:
            spec["successPolicy"] = success_policy
        if failure_policy is not None:
            spec["failurePolicy"] = failure_policy
        body = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": f"xmc-{wu.experiment_id}-{wu.wid}", "namespace": NS, "labels": labels,
                         "finalizers": [mapping.FINALIZER]},
            "spec": spec,
        }
        return client.custom_objects().create_namespaced_custom_object(  # type: ignore[no-any-return]
            client.JOBSET_GROUP, client.JOBSET_VERSION, NS, client.JOBSET_PLURAL, body
        )

    def jobset(self, wu: WorkUnit) -> dict[str, Any] | None:
        try:
            return client.custom_objects().get_namespaced_custom_object(  # type: ignore[no-any-return]
                client.JOBSET_GROUP, client.JOBSET_VERSION, NS, client.JOBSET_PLURAL, f"xmc-{wu.experiment_id}-{wu.wid}"
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete_jobset(self, wu: WorkUnit) -> None:
        client.custom_objects().delete_namespaced_custom_object(
            client.JOBSET_GROUP, client.JOBSET_VERSION, NS, client.JOBSET_PLURAL, f"xmc-{wu.experiment_id}-{wu.wid}",
            body={"propagationPolicy": "Background"},
        )

    def strip_finalizer_and_delete(self, wu: WorkUnit) -> None:
        """Someone outside XMC deletes a JobSet and removes our finalizer."""
        name = f"xmc-{wu.experiment_id}-{wu.wid}"
        client.custom_objects().patch_namespaced_custom_object(
            client.JOBSET_GROUP, client.JOBSET_VERSION, NS, client.JOBSET_PLURAL, name, {"metadata": {"finalizers": []}}
        )
        self.delete_jobset(wu)


def execution(wu: WorkUnit, eid: int | None = None) -> WorkUnitExecution:
    wu.refresh_from_db()
    return WorkUnitExecution.objects.get(work_unit=wu, eid=eid or wu.current_eid)


def state_of(wu: WorkUnit, eid: int | None = None) -> str:
    return execution(wu, eid).state


@pytest.fixture
def make_cluster(start_simulator: Callable[..., SimulatorHandle], settings: Any) -> Iterator[Callable[..., Cluster]]:
    """Factory: ``make_cluster(speed=..., **config_overrides)`` starts a simulator and points the client at it."""

    def make(speed: float = SPEED, **overrides: Any) -> Cluster:
        handle = start_simulator(speed=speed, **overrides)
        settings.KUBECONFIG = str(handle.kubeconfig_path)
        client.reset()
        return Cluster(handle)

    yield make
    client.reset()


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster()


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
