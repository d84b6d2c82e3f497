"""Is my job using its GPUs? On the whole system ``./dev run`` starts, with its real Prometheus (issue 41).

A work unit with 2 A100s whose pod script keeps them busy (``gpu=util:0.9``) is
launched through the REST API; once the test has seen a busy point recorded it
makes them idle (the pod's live ``sim.xmc.dev/gpu`` annotation), so a slow scrape
or collector delays the test and never skips the busy phase. Debian's Prometheus (started by scripts/run_all.py) scrapes the simulator's
DCGM exporter and cAdvisor text every second; beat runs the collector every
second (``SYSTEM_ENV``: short interval and idle thresholds). The researcher sees
the utilisation curve on the unit's page (its System group and the chart data
behind it), the unit gets the WARNING "2 GPUs idle for 4 s" and a WORK_UNIT_IDLE
event reaches the subscriber; ``kubectl top``'s API (metrics.k8s.io PodMetrics)
answers for the pod through the real ``kubernetes`` client. Its GPU-hours (2 GPUs x
its running time so far) and its utilisation-weighted GPU-hours used (busy, then
idle: more than none, less than all) appear in ``GET /v1/usage`` and, in Debian's
Chromium, on the ``/usage`` page (issue 41's "Done means").

"""
from __future__ import annotations

import json
import os
import re
import urllib.request
from datetime import datetime
from typing import Any

import pytest
import requests
from google.protobuf import json_format
from kubernetes import client

from django.utils import timezone

from core import pb
from metrics import system_names
from metrics.models import MetricSummary
from notifications import services as notification_services
from notifications.models import Event
from simulators.cluster.controllers.script import GPU_ANNOTATION
from tests import factories
from tests.fixtures import browsers
from tests.system.e2e.conftest import System, eventually
from tests.system.e2e.test_walkthrough import _signed_in
from usage.models import RunningInterval
from workunits.models import WorkUnitExecution
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM_ENV = {"XMC_SYSTEM_METRICS_INTERVAL_S": "1", "XMC_IDLE_GPU_AFTER_S": "4", "XMC_PROMETHEUS_SCRAPE_S": "1",
              "XMC_PROMETHEUS_RATE_WINDOW_S": "5"}
ADMIN = "admin@example.com"


def _call(system: System, method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {system.exports['XMC_AUTH_TOKEN']}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def _simulator(system: System) -> str:
    found = re.search(r"server:\s*(\S+)", (system.run_dir / "kubeconfig").read_text())
    assert found
    return found.group(1).strip("'\"")


def gpu_unit() -> dict[str, Any]:
    message = factories.work_unit_message(name="trainer")
    job = message.executable.jobset.jobs[0]
    job.spec.resources.CopyFrom(pb.resources.ResourceSet(gpu_resources=pb.resources.GpuResources(type="A100", count=2)))
    job.annotations["sim.xmc.dev/script"] = "pull=1s;run=forever;gpu=util:0.9,mem:0.3"
    return json_format.MessageToDict(message)


def test_it_shows_a_gpu_job_that_goes_idle_its_curve_the_idle_warning_and_a_notification(system: System) -> None:
    assert "XMC_PROMETHEUS_URL" in (system.run_dir / "env").read_text()  # run_all started Prometheus
    notification_services.create(Identity(ADMIN), {"events": ["WORK_UNIT_IDLE"], "allMyExperiments": True, "email": {}})
    experiment = _call(system, "POST", f"{system.api}/v1/experiments", {"title": "idle gpus"})
    xid = int(experiment["name"].rsplit("/", 1)[1])
    _call(system, "POST", f"{system.api}/v1/experiments/{xid}/workUnits", gpu_unit())

    def execution() -> WorkUnitExecution | None:
        return WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, eid=1).first()

    eventually(lambda: (ex := execution()) is not None and ex.state == "RUNNING", timeout=120, what="RUNNING")

    # kubectl top's API: the pod's PodMetrics through the real client.
    with client.ApiClient(client.Configuration(host=_simulator(system))) as api:
        pods = client.CoreV1Api(api).list_namespaced_pod("default", label_selector=f"jobset.sigs.k8s.io/jobset-name=xmc-{xid}-1")
        (pod,) = pods.items
        metrics = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "metrics.k8s.io", "v1beta1", "default", "pods", pod.metadata.name)
        assert metrics["kind"] == "PodMetrics" and metrics["containers"][0]["name"] == pod.spec.containers[0].name

        # Busy until the collector has recorded it; then idle.
        eventually(lambda: MetricSummary.objects.filter(work_unit__experiment_id=xid, eid=1, metric=system_names.GPU_UTILIZATION,
                                                        max__gte=0.85).exists(), timeout=120, what="a busy point")
        client.CoreV1Api(api).patch_namespaced_pod(pod.metadata.name, "default", {"metadata": {"annotations": {
            GPU_ANNOTATION: "util:0,mem:0.3"}}})

    # The idle warning, once the GPUs have been idle for 4 s.
    def warned() -> str | None:
        message = (ex.system_message or {}) if (ex := execution()) is not None else {}
        return message.get("userFacingText") if message.get("severity") == "WARNING" else None

    text = eventually(warned, timeout=120, what="the idle warning")
    assert text.startswith("2 GPUs idle for 4 s"), text
    event = eventually(lambda: Event.objects.filter(type="WORK_UNIT_IDLE", xid=xid, wid=1, eid=1).first(), timeout=30,
                       what="the WORK_UNIT_IDLE event")
    assert event.data["gpus"] == 2

    # The curve: busy, then idle, on the unit's page (its System group and the chart's data).
    ui = system.exports["XMANAGER_UI_URL"]
    pages = _signed_in(ui)
    page = pages.get(f"{ui}/experiments/{xid}/workUnits/1", timeout=30).text
    assert "<h2>System</h2>" in page and "GPU utilisation (0-1, mean over its GPUs)" in page
    data = pages.get(f"{ui}/experiments/{xid}/workUnits/1/metrics/data",
                     params={"metric": system_names.GPU_UTILIZATION, "width": 500}, timeout=30).json()
    (series,) = data["plots"][0]["series"]
    values = [v for v in series["y"] if v is not None]
    assert max(values) >= 0.85 and values[-1] == 0.0, values  # busy at first, idle now
    assert values.index(max(values)) < len(values) - 1
    summary = _call(system, "GET", f"{system.api}/v1/experiments/{xid}/workUnits:summarize?metrics="
                    f"{system_names.GPU_UTILIZATION},{system_names.CPU_USAGE_CORES}")
    (row,) = summary["workUnits"]
    assert row["metrics"][system_names.GPU_UTILIZATION]["max"] >= 0.85  # the sweep table reads them too
    assert requests.get(f"{ui}/healthz", timeout=10).status_code == 200

    # Its GPU-hours: allocated (2 GPUs x its running time so far) and used (weighted by the samples' mean).
    started = RunningInterval.objects.get(execution=execution()).start_time
    before = timezone.now()
    rows = _call(system, "GET", f"{system.api}/v1/usage?groupBy=experiment")["rows"]
    after = timezone.now()
    (row,) = [r for r in rows if r["key"] == str(xid)]
    assert _gpu_hours(started, before) - 1e-5 <= row["gpuHours"] <= _gpu_hours(started, after) + 1e-5, (row, started)
    assert row["executions"] == 1 and row["cpuHours"] == 0  # it asked for GPUs only
    assert 0 < row["gpuHoursUsed"] < 0.9 * row["gpuHours"], row  # it worked, then idled
    (mine,) = [r for r in _call(system, "GET", f"{system.api}/v1/usage?groupBy=owner")["rows"] if r["key"] == ADMIN]
    assert mine["gpuHours"] >= row["gpuHours"]
    _usage_page_shows(ui, xid, pages)


def _gpu_hours(started: datetime, now: datetime) -> float:
    return 2 * (now - started).total_seconds() / 3600


def _usage_page_shows(ui: str, xid: int, session: requests.Session) -> None:
    """The /usage page by experiment names it, with the share of its GPU-hours used: in Chromium when installed."""
    def check(row: str) -> None:
        assert "idle gpus" in row, row
        used = re.search(r"\((\d+)%\)", row)
        assert used and 0 < int(used.group(1)) < 90, row

    if browsers.CHROMIUM is None:  # the same page as HTML
        html = session.get(f"{ui}/usage", params={"groupBy": "experiment"}, timeout=30).text
        rows = [r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if f'href="/experiments/{xid}"' in r]
        assert len(rows) == 1, html
        check(rows[0])
        return
    with browsers.chromium() as chromium:
        page = chromium.new_page()
        page.goto(f"{ui}/login")
        page.fill("#id_username", "admin")
        page.fill("#id_password", os.environ.get("XMC_ADMIN_PASSWORD", "admin"))
        page.click("button[type=submit]")
        page.wait_for_url(f"{ui}/**")
        page.click("header.top a[href='/usage']")
        page.wait_for_url(f"{ui}/usage")
        page.select_option("select[name=groupBy]", "experiment")
        page.click("#usage-query button[type=submit]")
        page.wait_for_url(f"{ui}/usage?*")
        row = page.locator("#usage tbody tr", has=page.locator(f"a[href='/experiments/{xid}']"))
        assert row.count() == 1
        check(row.inner_text())
