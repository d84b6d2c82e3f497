"""Conformance of the simulator's API as seen through the real kubectl binary."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import yaml

from simulators.cluster.server import SimulatorHandle
from simulators.cluster.store import format_time
from tests.simulators.cluster.api.conftest import KubectlRunner

JOBSET_YAML = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: {name}
  labels:
    team: research
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: main
              image: busybox:1.36
"""

POD_YAML = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels:
    app: trainer
spec:
  containers:
  - name: main
    image: busybox:1.36
"""


def test_it_lists_namespaces_with_status_columns(kubectl: KubectlRunner, ns: str) -> None:
    out = kubectl("get", "namespaces", namespace=None).stdout
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "STATUS", "AGE"]
    assert any(row.split()[:2] == [ns, "Active"] for row in rows)


def test_it_creates_from_a_file_and_prints_jobset_printer_columns(kubectl: KubectlRunner) -> None:
    created = kubectl("create", "-f", "-", input=JOBSET_YAML.format(name="ada"))
    assert created.stdout.strip() == "jobset.jobset.x-k8s.io/ada created"
    header, row = kubectl("get", "jobsets").stdout.splitlines()
    assert header.split() == ["NAME", "TERMINALSTATE", "RESTARTS", "COMPLETED", "SUSPENDED", "AGE"]
    assert row.split()[0] == "ada"
    as_yaml = yaml.safe_load(kubectl("get", "jobset", "ada", "-o", "yaml").stdout)
    assert as_yaml["metadata"]["generation"] == 1
    assert as_yaml["spec"]["replicatedJobs"][0]["replicas"] == 2
    missing = kubectl("get", "jobset", "nope", check=False)
    assert missing.returncode == 1
    assert 'Error from server (NotFound): jobsets.jobset.x-k8s.io "nope" not found' in missing.stderr


def test_it_applies_client_side_with_the_last_applied_annotation(kubectl: KubectlRunner) -> None:
    assert kubectl("apply", "-f", "-", input=JOBSET_YAML.format(name="bea")).stdout.strip() == \
        "jobset.jobset.x-k8s.io/bea created"
    assert kubectl("apply", "-f", "-", input=JOBSET_YAML.format(name="bea")).stdout.strip() == \
        "jobset.jobset.x-k8s.io/bea unchanged"
    changed = JOBSET_YAML.format(name="bea").replace("replicas: 2", "replicas: 3")
    assert kubectl("apply", "-f", "-", input=changed).stdout.strip() == "jobset.jobset.x-k8s.io/bea configured"
    obj = json.loads(kubectl("get", "jobset", "bea", "-o", "json").stdout)
    assert obj["spec"]["replicatedJobs"][0]["replicas"] == 3
    assert obj["metadata"]["generation"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in obj["metadata"]["annotations"]


def test_it_applies_a_pod_with_a_strategic_merge_patch(kubectl: KubectlRunner) -> None:
    kubectl("apply", "-f", "-", input=POD_YAML.format(name="cy"))
    relabelled = POD_YAML.format(name="cy").replace("app: trainer", "app: evaluator")
    assert kubectl("apply", "-f", "-", input=relabelled).stdout.strip() == "pod/cy configured"
    labels = kubectl("get", "pod", "cy", "-o", "jsonpath={.metadata.labels.app}").stdout
    assert labels == "evaluator"


def test_it_patches_labels_and_annotates(kubectl: KubectlRunner) -> None:
    kubectl("create", "-f", "-", input=JOBSET_YAML.format(name="dee"))
    kubectl("patch", "jobset", "dee", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    kubectl("patch", "jobset", "dee", "--type=json", "-p",
            '[{"op":"replace","path":"/spec/replicatedJobs/0/replicas","value":4}]')
    kubectl("label", "jobset", "dee", "xmc.google.com/xid=42")
    kubectl("annotate", "jobset", "dee", "xmc.google.com/notify-when=done")
    obj = json.loads(kubectl("get", "jobset", "dee", "-o", "json").stdout)
    assert obj["spec"]["suspend"] is True
    assert obj["spec"]["replicatedJobs"][0]["replicas"] == 4
    assert obj["metadata"]["labels"]["xmc.google.com/xid"] == "42"
    assert obj["metadata"]["annotations"]["xmc.google.com/notify-when"] == "done"
    assert obj["metadata"]["generation"] == 3
    header, row = kubectl("get", "jobsets").stdout.splitlines()
    assert row.split()[1] == "true"  # the SUSPENDED column (others are empty)

    smp = kubectl("patch", "jobset", "dee", "-p", '{"spec":{"suspend":false}}', check=False)
    assert smp.returncode == 1
    assert "application/strategic-merge-patch+json is not supported by jobset.x-k8s.io/v1alpha2, Kind=JobSet" in smp.stderr
    failed = kubectl("patch", "jobset", "dee", "--type=json", "-p",
                     '[{"op":"test","path":"/spec/suspend","value":false}]', check=False)
    assert failed.returncode == 1 and "the server rejected our request" in failed.stderr


def _watching(api_simulator: SimulatorHandle, cache: Path, ns: str, *args: str) -> subprocess.Popen[str]:
    """Real kubectl, started in the background; returned once its watch request has been answered
    (read from its request log, ``-v=6`` on stderr), so what the test changes next happens while it
    watches."""
    env = dict(os.environ, KUBECACHEDIR=str(cache))
    env.pop("KUBECONFIG", None)
    proc = subprocess.Popen(["kubectl", "--kubeconfig", str(api_simulator.kubeconfig_path), "--cache-dir", str(cache),
                             "-n", ns, "-v=6", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    watchdog = threading.Timer(30, proc.kill)  # a kubectl that never watches fails the test, never hangs it
    watchdog.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "watch=true" in line and " 200 OK" in line:
                return proc
    finally:
        watchdog.cancel()
    proc.wait()
    raise AssertionError(f"kubectl {' '.join(args)} ended without watching ({proc.returncode})")


def test_it_deletes_through_finalizers_and_waits(api_simulator: SimulatorHandle, kubectl: KubectlRunner,
                                                 kubectl_cache: Path, ns: str) -> None:
    kubectl("create", "-f", "-", input=JOBSET_YAML.format(name="eve").replace(
        "  labels:", "  finalizers: [jobset.xmanager.cloud/finalizer]\n  labels:"))
    kubectl("delete", "jobset", "eve", "--wait=false")
    obj = json.loads(kubectl("get", "jobset", "eve", "-o", "json").stdout)
    assert obj["metadata"]["deletionTimestamp"]

    waiting = _watching(api_simulator, kubectl_cache, ns, "wait", "--for=delete", "jobset/eve", "--timeout=20s")
    assert waiting.poll() is None  # still waiting: the finalizer holds the JobSet
    kubectl("patch", "jobset", "eve", "--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    waiting.communicate(timeout=30)
    assert waiting.returncode == 0
    assert kubectl("get", "jobset", "eve", check=False).returncode == 1


def test_it_waits_for_a_status_condition(api_simulator: SimulatorHandle, kubectl: KubectlRunner, kubectl_cache: Path,
                                         ns: str) -> None:
    kubectl("create", "-f", "-", input=JOBSET_YAML.format(name="fay"))
    waiting = _watching(api_simulator, kubectl_cache, ns, "wait", "--for=condition=Completed", "jobset/fay", "--timeout=20s")
    assert waiting.poll() is None  # still waiting: not completed yet
    api_simulator.store.patch("jobsets", ns, "fay", "merge", {"status": {"terminalState": "Completed", "conditions": [
        {"type": "Completed", "status": "True", "reason": "AllJobsCompleted", "message": "jobset completed successfully",
         "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}, subresource="status")
    out, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == 0
    assert out.strip() == "jobset.jobset.x-k8s.io/fay condition met"
    row = kubectl("get", "jobset", "fay", "--no-headers").stdout.split()
    assert row[:3] == ["fay", "Completed", "True"]


def test_it_streams_get_watch_with_table_rows(api_simulator: SimulatorHandle, kubectl_cache: Path, ns: str) -> None:
    proc = _watching(api_simulator, kubectl_cache, ns, "get", "pods", "-w")
    watchdog = threading.Timer(30, proc.kill)  # rows that never come fail the test, never hang it
    watchdog.start()
    try:
        api_simulator.store.create("pods", ns, yaml.safe_load(POD_YAML.format(name="gil")))
        api_simulator.store.patch("pods", ns, "gil", "strategic", {"status": {"phase": "Running", "containerStatuses": [{
            "name": "main", "image": "busybox:1.36", "imageID": "", "ready": True, "restartCount": 0,
            "started": True, "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}}]}}, subresource="status")
        assert proc.stdout is not None
        out = "".join(proc.stdout.readline() for _ in range(3))  # the header and one row per event
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.communicate(timeout=10)
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1][:4] == ["gil", "0/1", "Pending", "0"]
    assert lines[2][:4] == ["gil", "1/1", "Running", "0"]


def test_it_prints_logs_and_describes_with_events(api_simulator: SimulatorHandle, kubectl: KubectlRunner, ns: str) -> None:
    kubectl("create", "-f", "-", input=POD_YAML.format(name="hal"))
    api_simulator.pod_logs.append(ns, "hal", "main", "epoch 1 loss 0.9\nepoch 2 loss 0.5")
    assert kubectl("logs", "hal").stdout == "epoch 1 loss 0.9\nepoch 2 loss 0.5\n"
    uid = api_simulator.store.get("pods", ns, "hal")["metadata"]["uid"]
    now = format_time(time.time())
    api_simulator.store.create("events", ns, {
        "metadata": {"name": "hal.1"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "hal", "namespace": ns, "uid": uid},
        "reason": "Pulled", "message": "Container image already present", "type": "Normal",
        "source": {"component": "kubelet"}, "count": 1,
        "firstTimestamp": now, "lastTimestamp": now,
    })
    described = kubectl("describe", "pod", "hal").stdout
    assert "Name:" in described and "hal" in described
    assert "Pulled" in described and "Container image already present" in described
    events = kubectl("get", "events").stdout.splitlines()
    assert events[0].split()[:4] == ["LAST", "SEEN", "TYPE", "REASON"]
    assert "pod/hal" in events[1]


def test_it_shows_kueue_printer_columns(api_simulator: SimulatorHandle, kubectl: KubectlRunner, ns: str) -> None:
    api_simulator.store.create("localqueues", ns, {"metadata": {"name": "lq"}, "spec": {"clusterQueue": "cq-main"}})
    api_simulator.store.create("workloads", ns, {"metadata": {"name": "jobset-x-1"}, "spec": {"queueName": "lq", "podSets": []}})
    assert kubectl("get", "lq").stdout.splitlines()[0].split() == [
        "NAME", "CLUSTERQUEUE", "PENDING", "WORKLOADS", "ADMITTED", "WORKLOADS"]
    header, row = kubectl("get", "wl").stdout.splitlines()
    assert header.split() == ["NAME", "QUEUE", "RESERVED", "IN", "ADMITTED", "FINISHED", "AGE"]
    assert row.split()[:2] == ["jobset-x-1", "lq"]
    all_ns = kubectl("get", "wl", "-A", namespace=None).stdout
    assert any(line.split()[:2] == [ns, "jobset-x-1"] for line in all_ns.splitlines())


def test_it_applies_server_side_and_lists_pods_across_namespaces(kubectl: KubectlRunner, ns: str) -> None:
    applied = kubectl("apply", "--server-side", "-f", "-", input=POD_YAML.format(name="ivy"))
    assert applied.stdout.strip() == "pod/ivy serverside-applied"
    again = kubectl("apply", "--server-side", "-f", "-",
                    input=POD_YAML.format(name="ivy").replace("app: trainer", "app: tuner"))
    assert again.returncode == 0
    assert kubectl("get", "pod", "ivy", "-o", "jsonpath={.metadata.labels.app}").stdout == "tuner"
    wide = kubectl("get", "pods", "-A", "-o", "wide", namespace=None).stdout.splitlines()
    assert wide[0].split()[:6] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert any(line.split()[:2] == [ns, "ivy"] for line in wide[1:])
    kubectl("delete", "pod", "ivy")
    assert kubectl("get", "pods").stderr.strip() == f"No resources found in {ns} namespace."
