"""The one simulator fixture plugin (registered by tests/conftest.py through ``pytest_plugins``).

* ``api_simulator``: one API-only cluster simulator for the session (no
  controllers: nothing but the test changes objects), with a kubeconfig;
* ``api_cluster``: the same, with the real ``kubernetes`` client of
  ``k8s_bridge.client`` pointed at it for one test (``settings.KUBECONFIG``);
* ``start_simulator``: a factory of served simulators with controllers, each
  with its own queue configuration (:func:`queues_config`), stopped when the
  test ends: the reconciler's and the fidelity stories' ``make_cluster`` are
  thin wrappers over it;
* :func:`queues_config`: the default queue configuration with a test's overrides;
* :func:`rjob`: a JobSet replicated job whose pods follow a simulator pod script.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s_bridge import client
from simulators.cluster.controllers.config import DEFAULT_CONFIG
from simulators.cluster.server import SimulatorHandle, run_simulator

NAMESPACE = "default"


@pytest.fixture(scope="session")
def api_simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatorHandle]:
    kubeconfig = tmp_path_factory.mktemp("api-sim") / "kubeconfig"
    handle = run_simulator(port=0, controllers=False, kubeconfig_out=str(kubeconfig))
    yield handle
    handle.stop()


@pytest.fixture
def api_cluster(api_simulator: SimulatorHandle, settings: Any) -> Iterator[SimulatorHandle]:
    settings.KUBECONFIG = str(api_simulator.kubeconfig_path)
    settings.XMC_K8S_NAMESPACE = NAMESPACE
    client.reset()
    yield api_simulator
    client.reset()


_configs = itertools.count()


def queues_config(folder: Path, **overrides: Any) -> Path:
    """The default queue configuration (Kueue 0.19's defaults) with ``overrides``, written into ``folder``.

    A mapping (``kueue={...}``, ``jobset={...}``) is merged one level into the
    default's mapping of that key; anything else (``clusterQueues=[...]``) replaces it.
    """
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = folder / f"queues-{next(_configs)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def start_simulator(tmp_path: Path) -> Iterator[Callable[..., SimulatorHandle]]:
    """Factory: ``start_simulator(speed=..., **config_overrides)`` serves a simulator with controllers on a
    free port, with a kubeconfig of its own; every one started is stopped when the test ends."""
    handles: list[SimulatorHandle] = []

    def start(*, speed: float, **overrides: Any) -> SimulatorHandle:
        config = str(queues_config(tmp_path, **overrides)) if overrides else None
        kubeconfig = tmp_path / f"kubeconfig-{len(handles)}"
        handle = run_simulator(port=0, speed=speed, queues_config=config, kubeconfig_out=str(kubeconfig))
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


def rjob(name: str, *, replicas: int = 1, pods: int = 1, script: str | None = "pull=1s;run=5s;exit=0",
         cpu: str | None = "1", backoff_limit: int | None = 0, restart_policy: str | None = "Never",
         completions: int | None | str = "pods", depends_on: list[dict[str, str]] | None = None,
         priority_class: str | None = None, **job_spec: Any) -> dict[str, Any]:
    """A replicated job whose pods follow the simulator pod ``script`` (``completions="pods"``: one per pod)."""
    container: dict[str, Any] = {"name": "main", "image": "busybox:1.36"}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if restart_policy:
        pod_spec["restartPolicy"] = restart_policy
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    tmpl: dict[str, Any] = {"spec": pod_spec}
    if script is not None:
        tmpl["metadata"] = {"annotations": {"sim.xmc.dev/script": script}}
    spec: dict[str, Any] = {"parallelism": pods, "template": tmpl, **job_spec}
    if completions == "pods":
        spec["completions"] = pods
    elif completions is not None:
        spec["completions"] = completions
    if backoff_limit is not None:
        spec["backoffLimit"] = backoff_limit
    out: dict[str, Any] = {"name": name, "replicas": replicas, "template": {"spec": spec}}
    if depends_on:
        out["dependsOn"] = depends_on
    return out
