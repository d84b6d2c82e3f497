"""`python -m simulators.cluster` as a developer runs it: a kubeconfig, controllers, persisted state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.simulators.cluster.api.test_kopf import wait_until

ROOT = Path(__file__).resolve().parents[4]


def start(tmp_path: Path, state: Path, log_name: str) -> tuple[subprocess.Popen[bytes], Path]:
    kubeconfig = tmp_path / f"{log_name}.kubeconfig"
    log = open(tmp_path / f"{log_name}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulators.cluster", "--port", "0", "--speed", "20",
         "--kubeconfig-out", str(kubeconfig), "--state-file", str(state)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
    )
    wait_until(kubeconfig.exists, timeout=20)
    return proc, kubeconfig


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)


def custom_objects(kubeconfig: Path) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))


JOBSET: dict[str, Any] = yaml.safe_load("""
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: quick
  labels: {kueue.x-k8s.io/queue-name: default}
spec:
  replicatedJobs:
  - name: w
    replicas: 2
    template:
      spec:
        template:
          metadata:
            annotations: {sim.xmc.dev/script: "pull=1s;run=4s;exit=0"}
          spec:
            restartPolicy: Never
            containers: [{name: main, image: busybox:1.36}]
""")


def test_it_runs_a_jobset_to_completion_and_keeps_state_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    proc, kubeconfig = start(tmp_path, state, "first")
    try:
        co = custom_objects(kubeconfig)
        co.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", JOBSET)

        def completed() -> bool:
            obj = co.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "quick")
            return (obj.get("status") or {}).get("terminalState") == "Completed"

        wait_until(completed, timeout=30)
        before = co.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "quick")
    finally:
        stop(proc)
    assert state.exists()

    proc, kubeconfig = start(tmp_path, state, "second")
    try:
        co = custom_objects(kubeconfig)
        after = co.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "quick")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["terminalState"] == "Completed"
        queues = co.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "localqueues")
        assert queues["items"], "the default queues are seeded"
    finally:
        stop(proc)
    text = (tmp_path / "second.log").read_text()
    assert "state saved" in text and "Traceback" not in text
