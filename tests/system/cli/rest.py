"""Seeding a live system over REST, as a launch would (urllib: the suite's venv needs nothing more)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

SCRIPT = "sim.xmc.dev/script"


def call(api: str, token: str, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        api + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None


def work_unit(script: str, *, args: dict[str, str] | None = None, queue: str = "cpu-queue", replicas: int = 1,
              retries: int = 0, cpu_millicores: int = 500) -> dict[str, Any]:
    return {
        "executable": {
            "schedulingConstraints": {"queueName": queue},
            "jobset": {"jobs": [{
                "name": "main", "replicas": replicas, "retryLimit": retries,
                "annotations": {SCRIPT: script},
                "spec": {"dockerImage": "gcr.io/xmc-demo/trainer:v1", "args": args or {},
                         "resources": {"cpuResources": {"cpuMillicores": cpu_millicores, "memoryBytes": str(1 << 30)}}},
            }]},
        },
    }


def experiment(api: str, token: str, title: str, units: list[dict[str, Any]]) -> int:
    """Create an experiment and its work units (wids 1, 2, ... in order), launch state COMPLETED; its xid."""
    created = call(api, token, "POST", "/v1/experiments", {"title": title})
    xid = int(created["name"].rpartition("/")[2])
    for unit in units:
        call(api, token, "POST", f"/v1/experiments/{xid}/workUnits", unit)
    call(api, token, "POST", f"/v1/experiments/{xid}:updateLaunchState", {"launchState": "COMPLETED"})
    return xid
