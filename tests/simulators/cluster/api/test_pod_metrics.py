"""The simulator's resource metrics, in upstream's shapes (issue 41 item 1).

metrics-server's ``metrics.k8s.io/v1beta1`` PodMetrics through the official
client's CustomObjectsApi (what ``kubectl top pods`` reads, list and get, with a
label selector), NVIDIA DCGM exporter's text for the pods that asked for GPUs and
cAdvisor's for every running container, all driven by the pod script's
``gpu=util:<expr>,mem:<expr>`` (and ``oom`` for memory near the limit).
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
import requests
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from simulators.cluster.controllers.script import GPU_ANNOTATION, ScriptError, parse_script
from simulators.cluster.server import SimulatorHandle
from tests.waiting import eventually

SIMULATOR_SPEED = 1.0  # module_simulator's (tests/fixtures/simulators.py): real time
NS = "default"


@pytest.fixture(scope="module")
def api(module_simulator: SimulatorHandle) -> Iterator[client.ApiClient]:
    with client.ApiClient(client.Configuration(host=module_simulator.url)) as api_client:
        yield api_client


def start_pod(api: client.ApiClient, name: str, script: str, *, gpus: int = 0, labels: dict[str, str] | None = None,
              memory_limit: str = "8Gi") -> None:
    limits = {"memory": memory_limit, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    client.CoreV1Api(api).create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": {"sim.xmc.dev/script": script}},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
                 "containers": [{"name": "trainer", "image": "trainer:1",
                                 "resources": {"requests": {"cpu": "4", "memory": "4Gi"}, "limits": limits}}]},
    })


def scrape(module_simulator: SimulatorHandle, path: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = requests.get(f"{module_simulator.url}{path}", timeout=10).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_it_shows_a_gpu_pods_scripted_utilisation_as_the_dcgm_exporter_does(module_simulator: SimulatorHandle,
                                                                            api: client.ApiClient) -> None:
    start_pod(api, "gpu-busy", "pull=0s;run=forever;gpu=util:0.75,mem:0.25", gpus=2)
    start_pod(api, "cpu-only", "pull=0s;run=forever")

    def gpus() -> list[tuple[dict[str, str], float]]:
        found = [s for s in scrape(module_simulator, "/metrics/dcgm").get("DCGM_FI_DEV_GPU_UTIL", []) if s[0]["pod"] == "gpu-busy"]
        assert len(found) == 2
        return found

    util = eventually(gpus, timeout=20, what="two GPUs of gpu-busy in the DCGM text", retry_on=(AssertionError,))
    assert sorted(labels["gpu"] for labels, _ in util) == ["0", "1"]
    labels, value = util[0]
    assert value == 75
    assert labels["namespace"] == NS and labels["container"] == "trainer" and labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["UUID"].startswith("GPU-") and labels["Hostname"].startswith("sim-node")
    families = scrape(module_simulator, "/metrics/dcgm")
    used = {s[0]["gpu"]: s[1] for s in families["DCGM_FI_DEV_FB_USED"] if s[0]["pod"] == "gpu-busy"}
    free = {s[0]["gpu"]: s[1] for s in families["DCGM_FI_DEV_FB_FREE"] if s[0]["pod"] == "gpu-busy"}
    assert used["0"] == pytest.approx(81559 * 0.25, abs=1) and used["0"] + free["0"] == pytest.approx(81559, abs=1)
    assert all(s[1] > 0 for s in families["DCGM_FI_DEV_POWER_USAGE"])
    assert not [s for s in families["DCGM_FI_DEV_GPU_UTIL"] if s[0]["pod"] == "cpu-only"]  # no GPUs asked for

    cadvisor = scrape(module_simulator, "/metrics/cadvisor")
    cpu = {s[0]["pod"]: s[1] for s in cadvisor["container_cpu_usage_seconds_total"]}
    assert cpu["cpu-only"] >= 0 and "gpu-busy" in cpu
    later = eventually(lambda: (v := {s[0]["pod"]: s[1] for s in scrape(module_simulator, "/metrics/cadvisor")
                                      ["container_cpu_usage_seconds_total"]})["gpu-busy"] > cpu["gpu-busy"] and v,
                       timeout=10, what="the CPU counter rising")
    assert later["gpu-busy"] > cpu["gpu-busy"]  # a counter: half the 4 requested cores, times the seconds run
    working = {s[0]["pod"]: s[1] for s in cadvisor["container_memory_working_set_bytes"]}
    assert working["gpu-busy"] == 2 * 2**30  # half the 4Gi requested


def test_it_makes_the_utilisation_follow_the_script_over_time(module_simulator: SimulatorHandle, api: client.ApiClient) -> None:
    start_pod(api, "busy-then-idle", "pull=0s;run=forever;gpu=util:max(0,min(0.9,(2-t)*10))", gpus=1)

    def util() -> float:
        (sample,) = [s for s in scrape(module_simulator, "/metrics/dcgm").get("DCGM_FI_DEV_GPU_UTIL", [])
                     if s[0]["pod"] == "busy-then-idle"]
        return sample[1]

    assert eventually(lambda: util() == 90, timeout=20, what="busy at first", retry_on=(ValueError,))
    assert eventually(lambda: util() == 0, timeout=20, what="idle after 2 s", retry_on=(ValueError,))


def test_it_changes_a_running_pods_load_from_then_on_by_its_gpu_annotation(module_simulator: SimulatorHandle,
                                                                     api: client.ApiClient) -> None:
    start_pod(api, "told-to-idle", "pull=0s;run=forever;gpu=util:0.9,mem:0.5", gpus=1)

    def util() -> float:
        (sample,) = [s for s in scrape(module_simulator, "/metrics/dcgm").get("DCGM_FI_DEV_GPU_UTIL", [])
                     if s[0]["pod"] == "told-to-idle"]
        return sample[1]

    assert eventually(lambda: util() == 90, timeout=20, what="busy", retry_on=(ValueError,))
    core = client.CoreV1Api(api)
    core.patch_namespaced_pod("told-to-idle", "default", {"metadata": {"annotations": {GPU_ANNOTATION: "util:0"}}})
    assert eventually(lambda: util() == 0, timeout=20, what="idle once annotated", retry_on=(ValueError,))
    core.patch_namespaced_pod("told-to-idle", "default", {"metadata": {"annotations": {GPU_ANNOTATION: "util:nope("}}})
    assert eventually(lambda: util() == 90, timeout=20, what="an invalid load ignored: the script's again",
                      retry_on=(ValueError,))


def test_it_lets_kubectl_top_read_pod_metrics_through_the_metrics_api(module_simulator: SimulatorHandle, api: client.ApiClient) -> None:
    start_pod(api, "topped", "pull=0s;run=forever", labels={"app": "top-me"})
    metrics = client.CustomObjectsApi(api)
    one = eventually(lambda: metrics.get_namespaced_custom_object("metrics.k8s.io", "v1beta1", NS, "pods", "topped"),
                     timeout=20, what="PodMetrics of a running pod", retry_on=(ApiException,))
    assert one["kind"] == "PodMetrics" and one["window"] and one["timestamp"]
    assert one["containers"] == [{"name": "trainer", "usage": {"cpu": "2000000000n", "memory": "2097152Ki"}}]
    listed = metrics.list_namespaced_custom_object("metrics.k8s.io", "v1beta1", NS, "pods", label_selector="app=top-me")
    assert listed["kind"] == "PodMetricsList" and [i["metadata"]["name"] for i in listed["items"]] == ["topped"]
    with pytest.raises(ApiException) as missing:
        metrics.get_namespaced_custom_object("metrics.k8s.io", "v1beta1", NS, "pods", "no-such-pod")
    assert missing.value.status == 404
    groups = client.ApisApi(api).get_api_versions()
    assert "metrics.k8s.io" in [g.name for g in groups.groups]

    kubectl = shutil.which("kubectl")
    if kubectl:  # the real kubectl top, where the machine has kubectl
        out = subprocess.run([kubectl, "--kubeconfig", str(module_simulator.kubeconfig_path), "top", "pods", "-n", NS, "topped"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "topped" in out.stdout and "2000m" in out.stdout


def test_it_climbs_memory_towards_its_limit_before_an_oom_kill(module_simulator: SimulatorHandle, api: client.ApiClient) -> None:
    start_pod(api, "leaky", "pull=0s;run=4s;exit=137;oom", memory_limit="1Gi")

    def working() -> float:
        (value,) = [s[1] for s in scrape(module_simulator, "/metrics/cadvisor")["container_memory_working_set_bytes"]
                    if s[0]["pod"] == "leaky"]
        return value

    assert eventually(lambda: working() > 0.9 * 2**30, timeout=20, what="near the 1Gi limit", retry_on=(ValueError,))
    limits = {s[0]["pod"]: s[1] for s in scrape(module_simulator, "/metrics/cadvisor")["container_spec_memory_limit_bytes"]}
    assert limits.get("leaky", 2**30) == 2**30


@pytest.mark.parametrize("text", ["gpu=util:", "gpu=mem:0.5", "gpu=util:0.5,util:0.4", "gpu=util:os.system(1)",
                                  "gpu=busy:1"])
def test_it_makes_a_bad_gpu_key_a_script_error(text: str) -> None:
    with pytest.raises(ScriptError):
        parse_script(text)


def test_it_reads_container_arguments_in_the_gpu_key_like_metrics() -> None:
    script = parse_script("gpu=util:arg('u')*1,mem:0.5", {"u": "0.3"})
    assert script.gpu_util == "0.3 * 1" and script.gpu_mem == "0.5"
