"""kopf, a third independent client, runs an operator against the simulator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulators.cluster.server import SimulatorHandle
from simulators.cluster.store import ApiError

OPERATOR = textwrap.dedent(
    """
    import kopf

    @kopf.on.startup()
    def configure(settings, **_):
        settings.posting.enabled = True
        settings.watching.server_timeout = 10
        settings.persistence.finalizer = "kopf.zalando.org/KopfFinalizerMarker"

    @kopf.on.create("jobset.x-k8s.io", "v1alpha2", "jobsets")
    def created(name, spec, **_):
        return {"replicas": spec["replicatedJobs"][0]["replicas"]}

    @kopf.on.update("jobset.x-k8s.io", "v1alpha2", "jobsets")
    def updated(name, spec, patch, **_):
        patch.metadata.labels["seen-suspend"] = str(spec.get("suspend", False)).lower()

    @kopf.on.delete("jobset.x-k8s.io", "v1alpha2", "jobsets")
    def deleted(name, **_):
        print(f"deleted-handler-ran {name}", flush=True)
    """
)


def jobset(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"replicatedJobs": [{"name": "w", "replicas": 3, "template": {}}]}}


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def test_it_lets_kopf_handle_create_update_and_delete_of_a_jobset(
    api_simulator: SimulatorHandle, ns: str, tmp_path: Path
) -> None:
    handlers = tmp_path / "operator.py"
    handlers.write_text(OPERATOR)
    log_path = tmp_path / "kopf.log"
    env = dict(os.environ, KUBECONFIG=str(api_simulator.kubeconfig_path))
    kopf_bin = str(Path(sys.executable).with_name("kopf"))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [kopf_bin, "run", "--standalone", f"--namespace={ns}", "--verbose", str(handlers)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    store = api_simulator.store
    try:
        # Once kopf watches JobSets (its log says so), not after a fixed 2 s.
        wait_until(lambda: "Starting the watch-stream for jobsets." in log_path.read_text())
        store.create("jobsets", ns, jobset("kopf-a"))

        def create_handled() -> Any:
            obj = store.get("jobsets", ns, "kopf-a")
            return (obj.get("status") or {}).get("created")

        assert wait_until(create_handled) == {"replicas": 3}
        obj = store.get("jobsets", ns, "kopf-a")
        assert "kopf.zalando.org/KopfFinalizerMarker" in obj["metadata"]["finalizers"]

        store.patch("jobsets", ns, "kopf-a", "merge", {"spec": {"suspend": True}})
        wait_until(lambda: (store.get("jobsets", ns, "kopf-a")["metadata"].get("labels") or {}).get("seen-suspend") == "true")

        store.delete("jobsets", ns, "kopf-a")

        def gone() -> bool:
            try:
                store.get("jobsets", ns, "kopf-a")
            except ApiError as err:
                return err.code == 404
            return False

        wait_until(gone)
        wait_until(lambda: "deleted-handler-ran kopf-a" in log_path.read_text())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    text = log_path.read_text()
    assert "Traceback" not in text, text[-3000:]
