"""Fault injection in the simulator (simulators.cluster.faults), seen through the real kubernetes client.

Per verb and resource: HTTP errors (500, 503, 429 with Retry-After, 409),
added latency, connections dropped before or after the request was served,
watches closed mid-stream and 410 Gone on resume; set at run time over HTTP
(/sim/faults) or from a --faults file, with how often each fired.
"""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from simulators.cluster.faults import FaultRule
from simulators.cluster.server import SimulatorHandle, run_simulator


@pytest.fixture
def faults(api_simulator: SimulatorHandle) -> Iterator[Any]:
    api_simulator.faults.clear()
    yield api_simulator.faults
    api_simulator.faults.clear()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def cm(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}


@pytest.mark.parametrize("status", [500, 503, 429, 409])
def test_it_fails_a_matching_request_with_the_status_asked_for(
    core: client.CoreV1Api, ns: str, faults: Any, status: int
) -> None:
    faults.add(action="error", verb="create", resource="pods", status=status, times=1, retry_after=7)
    with pytest.raises(ApiException) as failed:
        core.create_namespaced_pod(ns, cm("a"))
    assert failed.value.status == status
    assert json.loads(failed.value.body)["kind"] == "Status"
    if status == 429:
        assert failed.value.headers["Retry-After"] == "7"
    core.create_namespaced_pod(ns, cm("a"))  # times=1: the next one goes through
    core.read_namespaced_pod("a", ns)  # other verbs were never affected


def test_it_adds_latency(core: client.CoreV1Api, ns: str, faults: Any) -> None:
    core.create_namespaced_pod(ns, cm("slow"))
    faults.add(action="latency", verb="get", resource="pods", latency_s=0.5)
    started = time.monotonic()
    core.read_namespaced_pod("slow", ns)
    assert time.monotonic() - started >= 0.5


def test_it_leaves_the_request_done_for_a_connection_dropped_after_it(
    core: client.CoreV1Api, ns: str, faults: Any, api_simulator: SimulatorHandle
) -> None:
    faults.add(action="drop_after", verb="create", resource="pods", times=1)
    with pytest.raises(Exception):  # noqa: B017 - urllib3's ProtocolError / MaxRetryError: no answer
        core.create_namespaced_pod(ns, cm("half"))
    assert api_simulator.store.get("pods", ns, "half")["metadata"]["name"] == "half"  # it happened all the same


def test_it_changes_nothing_for_a_connection_dropped_before_the_request(
    core: client.CoreV1Api, ns: str, faults: Any, api_simulator: SimulatorHandle
) -> None:
    faults.add(action="drop", verb="create", resource="pods", times=1)
    with pytest.raises(Exception):  # noqa: B017
        core.create_namespaced_pod(ns, cm("never"))
    assert api_simulator.store.list("pods", ns)[0] == []


def test_it_closes_a_watch_mid_stream_and_answers_gone_on_resume(
    core: client.CoreV1Api, ns: str, faults: Any
) -> None:
    for i in range(5):
        core.create_namespaced_pod(ns, cm(f"w{i}"))
    faults.add(action="watch_close", verb="watch", resource="pods", after_events=2, times=1)
    seen = [e["object"].metadata.name for e in watch.Watch().stream(
        core.list_namespaced_pod, ns, resource_version="0", timeout_seconds=5)]
    assert len(seen) == 2  # closed cleanly after two events, long before its timeout
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    faults.add(action="gone", verb="watch", resource="pods", times=1)
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=5):
            pass
    assert gone.value.status == 410


def test_it_is_controlled_over_http_and_counts_what_fired(core: client.CoreV1Api, ns: str, api_simulator: SimulatorHandle,
                                                          faults: Any) -> None:
    def call(method: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(f"{api_simulator.url}/sim/faults", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = call("POST", {"seed": 7, "rules": [{"action": "error", "verb": "list", "resource": "pods",
                                                       "status": 503, "rate": 1.0, "times": 2}]})
    assert status == 200 and body["seed"] == 7
    for _ in range(2):
        with pytest.raises(ApiException):
            core.list_namespaced_pod(ns)
    core.list_namespaced_pod(ns)
    status, body = call("GET")
    assert body["rules"][0]["fired"] == 2 and body["rules"][0]["times"] == 0
    assert call("POST", {"action": "explode"})[0] == 400  # named: what is allowed
    assert call("DELETE")[1]["rules"] == []


def test_it_replays_a_seeded_rate() -> None:
    from simulators.cluster.faults import Faults

    def run() -> list[bool]:
        f = Faults(seed=3)
        f.add(action="error", verb="get", resource="jobsets", rate=0.3, status=500)
        return [f.decide("get", "jobsets") is not None for _ in range(200)]

    first = run()
    assert first == run() and 30 < sum(first) < 90


def test_it_loads_faults_from_a_file_at_start(tmp_path: Path) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text("seed: 1\nrules:\n  - {action: error, verb: list, resource: namespaces, status: 500, times: 1}\n")
    handle = run_simulator(port=0, controllers=False, faults=str(path))
    try:
        assert [r.action for r in handle.faults.rules] == ["error"]
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"{handle.url}/api/v1/namespaces", timeout=5)
        assert failed.value.code == 500
    finally:
        handle.stop()
    with pytest.raises(ValueError):
        FaultRule(action="error", status=418)
