"""Benchmark: how long a followed log line takes from the container to the reader, by path.

    ./dev bench logs_follow        (or: python bench/logs_follow.py [--lines 30])

Starts the whole system as ``./dev run`` does (``scripts/run_all.py``: the
simulator, web under ASGI, gRPC, worker, beat, reconciler) on a throw-away
database, launches one work unit whose pod prints ``step {n} loss {x}`` every
second, and follows its log three ways at once while it writes ``--lines``
lines:

* **kubelet** (the baseline, same run): the cluster's own
  ``pods/log?follow=true&timestamps=true`` read with the official client;
* **REST**: ``GET /v1/.../executions/1/logs?follow=true&timestamps=true``
  (``k8s_bridge.logs.views``);
* **panel**: the logs panel's event stream
  ``/experiments/<xid>/workUnits/1/logs/follow?ts=1`` (``ui.logfollow``), what
  a browser with Follow on receives.

For each line: the delay from the timestamp the pod gave it to its arrival at
the reader (same machine, same clock). Prints p50 / p99 / max per path and the
p50 ratio against the kubelet's. Target (issue: logs): the panel's line within
1 s of the container writing it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from typing import Any

from _django import ROOT, bench_database
from _signals import exit_on_termination

SCRIPT = "pull=1s;log=every:1s:step {n} loss {x};run=600s;exit=0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stamp_of(text: str) -> float | None:
    head = text.split(" ", 1)[0]
    if "T" not in head:
        return None
    head = head.replace("Z", "+00:00")
    if "." in head:  # the kubelet's nanoseconds: Python parses up to microseconds
        whole, rest = head.split(".", 1)
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits):]
        head = f"{whole}.{digits[:6].ljust(6, '0')}{zone}"
    try:
        return datetime.fromisoformat(head).timestamp()
    except ValueError:
        return None


class Follower(threading.Thread):
    """Reads lines from ``lines()`` and records (arrival - written) for each ``step`` line."""

    def __init__(self, name: str, lines: Any, want: int) -> None:
        super().__init__(daemon=True, name=name)
        self.label, self.lines, self.want = name, lines, want
        self.lags: list[float] = []
        self.error = ""

    def run(self) -> None:
        try:
            for text in self.lines():
                arrived = time.time()
                if " step " not in f" {text}":
                    continue
                written = stamp_of(text)
                if written is not None:
                    self.lags.append(arrived - written)
                if len(self.lags) >= self.want:
                    return
        except Exception as exc:  # noqa: BLE001 - reported in the table
            self.error = repr(exc)[:200]


def http_lines(url: str, token: str, sse: bool) -> Any:
    def lines() -> Any:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=120) as response:
            for raw in response:
                line = raw.decode(errors="replace").rstrip("\n")
                if not sse:
                    yield line
                elif line.startswith("data: "):
                    # <span class=""><span class="ts">STAMP </span>TEXT</span>
                    body = line[len("data: "):]
                    if 'class="ts">' in body:
                        yield body.split('class="ts">', 1)[1].replace("</span>", "", 1)
    return lines


def kubelet_lines(kubeconfig: str, xid: int) -> Any:
    def lines() -> Any:
        from kubernetes import client, config

        api = client.CoreV1Api(config.new_client_from_config(kubeconfig))
        pods = api.list_namespaced_pod("default", label_selector=f"jobset.sigs.k8s.io/jobset-name=xmc-{xid}-1").items
        pod = pods[0].metadata.name
        response = api.read_namespaced_pod_log(pod, "default", follow=True, timestamps=True, tail_lines=0,
                                               _preload_content=False)
        pending = b""
        for chunk in response.stream(1024):
            pending += chunk
            *done, pending = pending.split(b"\n")
            for line in done:
                yield line.decode(errors="replace")
    return lines


def start_system(database_url: str, run_dir: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    env = {**os.environ, "DATABASE_URL": database_url, "XMC_RUN_DIR": run_dir,
           "XMC_WEB_PORT": str(free_port()), "XMC_SIM_PORT": str(free_port()), "XMC_GRPC_PORT": str(free_port()),
           "XMC_MLRUN_EMULATOR_PORT": str(free_port()), "XMC_RECONCILER_METRICS_PORT": str(free_port())}
    env.pop("XMC_MLRUN_ENDPOINT", None)
    proc = subprocess.Popen([sys.executable, "scripts/run_all.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    output: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit("run_all exited:\n" + "".join(output))
        output.append(line)
        if "stops everything" in line:
            break
    else:
        raise SystemExit("run_all never became ready:\n" + "".join(output))
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    exports = {}
    for line in output:
        if line.startswith("export "):
            key, value = line[len("export "):].strip().split("=", 1)
            exports[key] = value.strip("'")
    return proc, exports


def call(api: str, token: str, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(api + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def row(name: str, lags: list[float], base: float | None, error: str) -> str:
    if not lags:
        return f"| {name} | no lines ({error or 'none arrived'}) | | | |"
    ordered = sorted(lags)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    ratio = f"{p50 / base:.2f}x" if base else "1.00x (baseline)"
    return f"| {name} | {p50 * 1000:.0f} ms | {p99 * 1000:.0f} ms | {max(ordered) * 1000:.0f} ms | {ratio} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=30, help="lines each follower waits for (one a second)")
    options = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)
    import tempfile

    with bench_database():
        from django.db import connection

        settings = connection.settings_dict
        database_url = (f"postgres://{settings['USER']}:{settings['PASSWORD'] or ''}@{settings['HOST']}:"
                        f"{settings['PORT']}/{settings['NAME']}")
        run_dir = tempfile.mkdtemp(prefix="xmc-bench-logs-")
        proc, exports = start_system(database_url, run_dir)
        try:
            api, token, ui = exports["XMC_API_URL"], exports["XMC_AUTH_TOKEN"], exports["XMANAGER_UI_URL"]
            xid = int(call(api, token, "POST", "/v1/experiments", {"title": "log follow bench"})["name"].rsplit("/")[-1])
            unit = {"executable": {"schedulingConstraints": {"queueName": "cpu-queue"}, "jobset": {"jobs": [{
                "name": "main", "replicas": 1, "annotations": {"sim.xmc.dev/script": SCRIPT},
                "spec": {"dockerImage": "gcr.io/xmc-demo/trainer:v1",
                         "resources": {"cpuResources": {"cpuMillicores": 500, "memoryBytes": str(1 << 30)}}}}]}}}
            call(api, token, "POST", f"/v1/experiments/{xid}/workUnits", unit)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                got = call(api, token, "GET", f"/v1/experiments/{xid}/workUnits/1")
                if (got.get("currentWorkUnitExecution") or {}).get("status", {}).get("state") == "RUNNING":
                    break
                time.sleep(0.5)
            else:
                raise SystemExit("the work unit never ran")
            time.sleep(2.0)  # its first lines are out: every follower starts mid-stream
            # The panel's stream re-reads the running log's end and sends what is after `after`.
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            followers = [
                Follower("kubelet pods/log follow", kubelet_lines(exports["KUBECONFIG"], xid), options.lines),
                Follower("REST logs?follow=true", http_lines(
                    f"{api}/v1/experiments/{xid}/workUnits/1/executions/1/logs?follow=true&timestamps=true&tailLines=0",
                    token, sse=False), options.lines),
                Follower("panel event stream (ui.logfollow)", http_lines(
                    f"{ui}/experiments/{xid}/workUnits/1/logs/follow?ts=1&after={now}", token, sse=True),
                    options.lines),
            ]
            for follower in followers:
                follower.start()
            for follower in followers:
                follower.join(timeout=options.lines * 2 + 60)
            base = statistics.median(followers[0].lags) if followers[0].lags else None
            print(f"Followed log, {options.lines} lines (one a second): delay from the pod's timestamp to arrival")
            print("| path | p50 | p99 | max | p50 vs kubelet |")
            print("| --- | --- | --- | --- | --- |")
            for i, follower in enumerate(followers):
                print(row(follower.label, follower.lags, None if i == 0 else base, follower.error))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
