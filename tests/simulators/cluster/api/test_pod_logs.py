"""pods/{name}/log of the simulator with the kubelet stand-in, through the official client and kubectl.

The script steps ``log=every:<d>:<template>``, ``print=`` and ``stderr=`` give
the pods real-looking output; the API serves it as the real API server does:
``tailLines``, ``sinceTime``/``sinceSeconds``, ``timestamps`` (RFC 3339 with
nanoseconds), ``previous`` for a restarted container, ``stream``, ``follow``
streaming while the container runs, and 400/422 for bad options.
"""
from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from simulators.cluster.server import SimulatorHandle
from tests.waiting import eventually

SIMULATOR_SPEED = 5.0  # module_simulator's (tests/fixtures/simulators.py)
NS = "default"


@pytest.fixture(scope="module")
def core(module_simulator: SimulatorHandle) -> Iterator[client.CoreV1Api]:
    with client.ApiClient(client.Configuration(host=module_simulator.url)) as api:
        yield client.CoreV1Api(api)


_names = iter(range(10_000))


def start_pod(core: client.CoreV1Api, script: str, restart: str = "Never") -> str:
    name = f"lp-{next(_names)}"
    core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"sim.xmc.dev/script": script}},
        "spec": {"restartPolicy": restart, "containers": [{"name": "main", "image": "busybox:1.36"}]},
    })
    return name


def log(core: client.CoreV1Api, name: str, **kw: Any) -> str:
    return core.read_namespaced_pod_log(name, NS, **kw)  # type: ignore[no-any-return]


def logged(core: client.CoreV1Api, name: str, needle: str, **kw: Any) -> str:
    def look() -> str | None:
        try:
            text = log(core, name, **kw)
        except ApiException:
            return None
        return text if needle in text else None

    return eventually(look, timeout=20, what=f"{needle!r} in the log of {name}")


def test_it_prints_progress_lines_and_fixed_text_for_a_template_step(core: client.CoreV1Api) -> None:
    name = start_pod(core, "pull=0s;print=hello from the trainer;log=every:1s:step {n} loss {x};run=forever")
    text = logged(core, name, "step 3 loss")
    lines = text.splitlines()
    assert lines[0] == "[sim] main: started image=busybox:1.36 attempt=0"
    assert lines[1] == "hello from the trainer"
    assert re.fullmatch(r"step 1 loss \d\.\d{4}", lines[2]) and lines[3].startswith("step 2 loss ")
    losses = [float(ln.rsplit(" ", 1)[1]) for ln in lines[2:]]
    assert losses == sorted(losses, reverse=True)  # it learns
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_it_honours_tail_since_time_and_timestamps(core: client.CoreV1Api, module_simulator: SimulatorHandle) -> None:
    name = start_pod(core, "pull=0s;log=every:1s:step {n};run=forever")
    logged(core, name, "step 6\n")
    assert log(core, name, tail_lines=2).splitlines() == log(core, name).splitlines()[-2:]
    assert log(core, name, tail_lines=0) == ""
    stamped = log(core, name, timestamps=True).splitlines()
    stamp, text = stamped[3].split(" ", 1)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z", stamp) and text.startswith("step 3")
    # sinceTime keeps lines written at or after that time (RFC 3339, second precision as kubectl sends it).
    at = datetime.fromisoformat(stamped[4].split(" ", 1)[0].replace("Z", "+00:00"))
    cut = at.replace(microsecond=0)
    # (the Python client has no since_time: the query kubectl --since-time sends)
    since = urllib3.PoolManager().request(
        "GET", f"{module_simulator.url}/api/v1/namespaces/{NS}/pods/{name}/log",
        fields={"sinceTime": cut.strftime("%Y-%m-%dT%H:%M:%SZ"), "timestamps": "true"}).data.decode().splitlines()
    assert since and all(datetime.fromisoformat(ln.split(" ", 1)[0].replace("Z", "+00:00")) >= cut for ln in since)
    assert stamped[4] in since and stamped[0] not in since
    assert log(core, name, since_seconds=3600).splitlines()[:2] == log(core, name).splitlines()[:2]
    assert log(core, name, limit_bytes=5) == "[sim]"
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_it_has_both_stdout_and_stderr_in_the_log_and_lets_one_choose(core: client.CoreV1Api, module_simulator: SimulatorHandle) -> None:
    name = start_pod(core, "pull=0s;run=2s;exit=3;stderr=Traceback (most recent call last):;stderr=RuntimeError: boom")
    text = logged(core, name, "exiting with code 3")
    assert text.splitlines()[-3:] == ["Traceback (most recent call last):", "RuntimeError: boom",
                                      "[sim] main: exiting with code 3"]
    raw = urllib3.PoolManager().request("GET", f"{module_simulator.url}/api/v1/namespaces/{NS}/pods/{name}/log?stream=Stderr")
    assert raw.status == 200
    assert raw.data.decode().splitlines() == ["Traceback (most recent call last):", "RuntimeError: boom",
                                              "[sim] main: exiting with code 3"]
    out = urllib3.PoolManager().request("GET", f"{module_simulator.url}/api/v1/namespaces/{NS}/pods/{name}/log?stream=Stdout")
    assert "RuntimeError" not in out.data.decode() and "started image" in out.data.decode()


def test_it_follows_by_streaming_new_lines_while_the_request_is_open(core: client.CoreV1Api) -> None:
    name = start_pod(core, "pull=0s;log=every:1s:step {n};run=6s;exit=0")
    logged(core, name, "started image")
    arrivals: list[tuple[float, str]] = []
    opened = time.monotonic()
    for line in watch.Watch().stream(core.read_namespaced_pod_log, name, NS, follow=True, _request_timeout=30):
        arrivals.append((time.monotonic() - opened, line))
    texts = [t for _, t in arrivals]
    assert texts[0].startswith("[sim] main: started") and texts[-1] == "[sim] main: exiting with code 0"
    assert [t for t in texts if t.startswith("step")] == [f"step {n}" for n in range(1, 7)]
    # Lines arrived one by one while the request was open (not all at the end).
    step_times = [at for at, t in arrivals if t.startswith("step")]
    assert step_times[-1] - step_times[0] > 0.4
    # The stream ended by itself when the container exited.
    assert arrivals[-1][0] < 10


def test_it_gives_the_restarted_containers_log_with_previous(core: client.CoreV1Api) -> None:
    name = start_pod(core, "pull=0s;crash=every:2s;exit=1;log=every:1s:attempt {attempt} line {n}", restart="Always")

    def restarted() -> bool:
        pod = core.read_namespaced_pod(name, NS)
        statuses = pod.status.container_statuses or []
        return bool(statuses and statuses[0].restart_count >= 1)

    eventually(restarted, timeout=20, what="a restart")
    previous = log(core, name, previous=True).splitlines()
    assert previous[0] == "[sim] main: started image=busybox:1.36 attempt=0"
    assert previous[-1] == "[sim] main: exiting with code 1"
    assert "attempt 0 line 1" in previous
    current = logged(core, name, "attempt=1")
    assert "attempt=0" not in current
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_it_says_so_for_a_container_without_a_previous_instance(core: client.CoreV1Api) -> None:
    name = start_pod(core, "pull=0s;run=forever")
    logged(core, name, "started image")
    with pytest.raises(ApiException) as err:
        log(core, name, previous=True)
    assert err.value.status == 400 and "previous terminated container" in err.value.body
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


@pytest.mark.parametrize(("query", "status", "needle"), [
    ("tailLines=-1", 422, "tailLines: Invalid value: -1: must be greater than or equal to 0"),
    ("tailLines=abc", 400, "tailLines"),
    ("limitBytes=0", 422, "limitBytes: Invalid value: 0: must be greater than 0"),
    ("sinceSeconds=0", 422, "sinceSeconds: Invalid value: 0"),
    ("sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z", 422, "at most one of `sinceTime` or `sinceSeconds`"),
    ("sinceTime=yesterday", 400, "sinceTime"),
    ("stream=Both", 422, 'stream: Unsupported value: "Both"'),
    ("follow=maybe", 400, "follow"),
])
def test_it_refuses_bad_options_naming_the_parameter(core: client.CoreV1Api, module_simulator: SimulatorHandle, query: str,
                                                       status: int, needle: str) -> None:
    name = start_pod(core, "pull=0s;run=forever")
    logged(core, name, "started image")
    resp = urllib3.PoolManager().request("GET", f"{module_simulator.url}/api/v1/namespaces/{NS}/pods/{name}/log?{query}")
    assert resp.status == status, resp.data
    assert needle in resp.json()["message"]
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_it_serves_kubectl_logs_follow_tail_and_previous(core: client.CoreV1Api, module_simulator: SimulatorHandle,
                                               tmp_path: Path) -> None:
    env = dict(os.environ, KUBECACHEDIR=str(tmp_path))
    env.pop("KUBECONFIG", None)
    base = ["kubectl", "--kubeconfig", str(module_simulator.kubeconfig_path), "--cache-dir", str(tmp_path), "-n", NS]
    name = start_pod(core, "pull=0s;log=every:1s:step {n};run=5s;exit=0")
    logged(core, name, "started image")
    proc = subprocess.Popen([*base, "logs", "-f", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(proc.stdout or []))
    reader.start()
    assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    reader.join(5)
    assert got[-1].strip() == "[sim] main: exiting with code 0" and "step 4\n" in got
    tail = subprocess.run([*base, "logs", "--tail=1", "--timestamps", name], capture_output=True, text=True, env=env,
                          timeout=30, check=True).stdout
    assert re.fullmatch(r"\S+Z \[sim\] main: exiting with code 0\n", tail)
    missing = subprocess.run([*base, "logs", "nope-pod"], capture_output=True, text=True, env=env, timeout=30)
    assert missing.returncode != 0 and 'pods "nope-pod" not found' in missing.stderr
    crashing = start_pod(core, "pull=0s;crash=every:1s;exit=2", restart="Always")
    eventually(lambda: (core.read_namespaced_pod(crashing, NS).status.container_statuses or [None])[0] is not None
               and core.read_namespaced_pod(crashing, NS).status.container_statuses[0].restart_count >= 1,
               timeout=20, what="a restart")
    prev = subprocess.run([*base, "logs", "-p", crashing], capture_output=True, text=True, env=env, timeout=30,
                          check=True).stdout
    assert prev.splitlines()[-1] == "[sim] main: exiting with code 2"
    core.delete_namespaced_pod(crashing, NS, grace_period_seconds=0)
