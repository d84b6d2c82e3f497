"""The deployment under deploy/ renders, runs every process, and is complete.

Rendered with the real ``kubectl kustomize``; the checks read the rendered
objects, so an overlay that drops something is caught too.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from xmc.celery import Queue

ROOT = Path(__file__).resolve().parents[3]
OVERLAY = ROOT / "deploy" / "overlays" / "example"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="requires kubectl (installed on CI)")


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def _of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def settings_read_from_environment() -> set[str]:
    """Every variable name xmc/settings.py reads with ``env.<type>("NAME", ...)``."""
    tree = ast.parse((ROOT / "xmc" / "settings.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "env"
                and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
    return names


def test_it_runs_every_process(objects: list[dict[str, Any]]) -> None:
    deployments = _of_kind(objects, "Deployment")
    expected = {"xmc-web", "xmc-grpc", "xmc-beat", "xmc-reconciler"} | {f"xmc-worker-{q.value}" for q in Queue}
    assert set(deployments) == expected
    assert deployments["xmc-reconciler"]["spec"]["replicas"] == 2  # one leader, one standby
    assert deployments["xmc-beat"]["spec"]["replicas"] == 1
    assert deployments["xmc-beat"]["spec"]["strategy"]["type"] == "Recreate"  # never two schedulers
    for q in Queue:
        args = deployments[f"xmc-worker-{q.value}"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("-Q") + 1] == q.value
    assert "xmc-migrate" in _of_kind(objects, "Job")


def test_it_gives_every_container_probes_resources_and_no_root(objects: list[dict[str, Any]]) -> None:
    services = _of_kind(objects, "Service")
    served = {s["spec"]["selector"]["app.kubernetes.io/name"] for s in services.values()}
    for name, deployment in _of_kind(objects, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for container in pod["containers"]:
            assert "livenessProbe" in container, name
            if name in served:
                assert "readinessProbe" in container, name
            assert container["resources"]["requests"]["cpu"], name
            assert container["resources"]["limits"]["memory"], name
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name


def test_it_provides_every_setting_the_code_reads(objects: list[dict[str, Any]]) -> None:
    config = next(iter(_of_kind(objects, "ConfigMap").values()))["data"]
    secret = next(iter(_of_kind(objects, "Secret").values()))["data"]
    provided = set(config) | set(secret)
    missing = settings_read_from_environment() - provided
    assert not missing, f"settings read by xmc/settings.py but not in deploy/: {sorted(missing)}"
    # Credentials never sit in the ConfigMap.
    for key in ("DATABASE_URL", "REDIS_URL", "XMC_SECRET_KEY", "XMC_TASK_SIGNING_KEY", "XMC_MLRUN_TOKEN"):
        assert key in secret and key not in config
    # Every Deployment reads both.
    for name, deployment in _of_kind(objects, "Deployment").items():
        refs = deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        kinds = {next(iter(r)) for r in refs}
        assert kinds == {"configMapRef", "secretRef"}, name


def test_it_mounts_no_kubernetes_token_where_no_api_is_called(objects: list[dict[str, Any]]) -> None:
    accounts = _of_kind(objects, "ServiceAccount")
    assert accounts["xmc-api"]["automountServiceAccountToken"] is False
    deployments = _of_kind(objects, "Deployment")
    for name in ("xmc-grpc", "xmc-beat"):
        assert deployments[name]["spec"]["template"]["spec"]["serviceAccountName"] == "xmc-api"
    # The web reads pod logs only (the logs endpoint): its own account, bound to xmc-logs-reader.
    assert deployments["xmc-web"]["spec"]["template"]["spec"]["serviceAccountName"] == "xmc-web"
    assert accounts["xmc-web"].get("automountServiceAccountToken") is not False
    [binding] = [b for b in _of_kind(objects, "RoleBinding").values() if b["roleRef"]["name"] == "xmc-logs-reader"]
    # So does the notifications worker: a failure message's last line before the archive has it.
    assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [
        ("ServiceAccount", "xmc-web"), ("ServiceAccount", "xmc-notifications")]
    assert (deployments[f"xmc-worker-{Queue.NOTIFICATIONS.value}"]["spec"]["template"]["spec"]["serviceAccountName"]
            == "xmc-notifications")
    for name in ("xmc-reconciler", f"xmc-worker-{Queue.ACTUATOR.value}"):
        assert deployments[name]["spec"]["template"]["spec"]["serviceAccountName"] == "xmc-controller"


def test_it_builds_a_pinned_non_root_image() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", dockerfile, re.M)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base.group(1))
    user = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert user and not user[-1].startswith(("root", "0"))
    assert "--no-deps -r requirements-xmanager.txt" in dockerfile


#: Every Kubernetes call the production code makes, as (API group, resource, verb), with where.
#: A call added to k8s_bridge/ needs its row here and its rule in deploy/base/rbac.yaml.
CALLS = {
    ("jobset.x-k8s.io", "jobsets", "get"),      # actuator: read_jobset
    ("jobset.x-k8s.io", "jobsets", "create"),   # actuator: create
    ("jobset.x-k8s.io", "jobsets", "delete"),   # actuator: delete with a UID precondition
    ("jobset.x-k8s.io", "jobsets", "patch"),    # actuator: notify-when; reconciler: finalizer removal
    ("jobset.x-k8s.io", "jobsets", "list"),     # reconciler watchers
    ("jobset.x-k8s.io", "jobsets", "watch"),
    ("kueue.x-k8s.io", "workloads", "list"),
    ("kueue.x-k8s.io", "workloads", "watch"),
    ("kueue.x-k8s.io", "localqueues", "get"),   # reconciler: a LocalQueue's ClusterQueue
    ("", "pods", "list"),                       # reconciler watchers; logs: an execution's pods
    ("", "pods", "watch"),
    ("", "pods/log", "get"),                    # logs endpoint and the log archiver
    ("batch", "jobs", "list"),                  # reconciler: the Jobs' failure reasons
    ("coordination.k8s.io", "leases", "get"),   # leader election
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    ("visibility.kueue.x-k8s.io", "clusterqueues/pendingworkloads", "get"),  # queue positions; the queues view
    ("kueue.x-k8s.io", "clusterqueues", "list"),  # the queues view (k8s_bridge/queues)
    ("kueue.x-k8s.io", "localqueues", "list"),
    ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get"),
}

#: The SDK methods behind CALLS; a method the code uses that is not here fails the test below.
SDK_METHODS = {
    "get_namespaced_custom_object", "create_namespaced_custom_object", "delete_namespaced_custom_object",
    "patch_namespaced_custom_object", "list_namespaced_custom_object", "list_namespaced_pod",
    "read_namespaced_lease", "create_namespaced_lease", "replace_namespaced_lease",
    "read_namespaced_pod_log", "list_namespaced_job", "list_cluster_custom_object",
}


def test_it_grants_exactly_the_verbs_the_code_uses(objects: list[dict[str, Any]]) -> None:
    granted = set()
    for kind in ("Role", "ClusterRole"):
        for role in _of_kind(objects, kind).values():
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        granted |= {(group, resource, verb) for verb in rule["verbs"]}
    assert granted == CALLS  # nothing missing, nothing more


def test_it_knows_every_kubernetes_call_of_the_production_code() -> None:
    used = set()
    for path in (ROOT / "k8s_bridge").rglob("*.py"):
        if "sim" in path.relative_to(ROOT / "k8s_bridge").parts[:1]:
            continue  # the simulator is not production code
        used |= set(re.findall(r"\b((?:get|create|delete|patch|list|read|replace|watch)_[a-z_]+)\(", path.read_text()))
    sdk_calls = {m for m in used if m.endswith(("_custom_object", "_pod", "_lease", "_pod_log", "_job"))}
    assert sdk_calls <= SDK_METHODS, sorted(sdk_calls - SDK_METHODS)
