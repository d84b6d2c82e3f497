"""Clients pointed at ``api_simulator``, the session's one API-only simulator (tests/fixtures/simulators.py).

The simulator runs in-process (`simulators.cluster.server.run_simulator` with
controllers off, so nothing reacts to the objects the tests write); every test
works in its own namespace.  kubectl runs with a discovery cache that is
fresh for this simulator instance.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from simulators.cluster.server import SimulatorHandle

_counter = itertools.count()


@pytest.fixture(scope="session")
def api_client(api_simulator: SimulatorHandle) -> Iterator[client.ApiClient]:
    config = client.Configuration(host=api_simulator.url)
    with client.ApiClient(config) as api:
        yield api


@pytest.fixture
def ns(api_simulator: SimulatorHandle, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for one test."""
    name = f"t{next(_counter)}-{request.node.name[8:40].replace('_', '-').strip('-')}".lower().rstrip("-")
    api_simulator.store.create("namespaces", None, {"metadata": {"name": name}})
    return name


@pytest.fixture(scope="session")
def kubectl_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kubectl-cache")


KubectlRunner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kubectl(api_simulator: SimulatorHandle, kubectl_cache: Path, ns: str) -> KubectlRunner:
    """Run real kubectl against the simulator in the test's namespace."""

    def run(*args: str, input: str | None = None, timeout: float = 30, check: bool = True,
            namespace: str | None = ns) -> subprocess.CompletedProcess[str]:
        cmd = ["kubectl", "--kubeconfig", str(api_simulator.kubeconfig_path), "--cache-dir", str(kubectl_cache)]
        if namespace:
            cmd += ["-n", namespace]
        env = dict(os.environ, KUBECACHEDIR=str(kubectl_cache))
        env.pop("KUBECONFIG", None)
        proc = subprocess.run([*cmd, *args], input=input, capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    return run
