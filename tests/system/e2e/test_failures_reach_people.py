"""Failures reach the people they concern, on the whole system ``./dev run`` starts (issue 38).

A create the cluster keeps refusing (item 1):

The simulator answers 500 to every JobSet create (``POST /sim/faults``). The
researcher's unit must say so while the actuator retries (a WARNING within
30 s), end FAILED with an ERROR naming the cause and what to do when the
actuator gives up, and the page's live stream and the notification event
must follow within 10 s of the dead letter, not minutes later through the
orphan sweep. The retry policy is short (``SYSTEM_ENV``) so the whole story
takes seconds.

A frozen worker (SIGSTOP, item 2) turns ``/readyz`` degraded and shows the
pages' banner within ``XMC_DEGRADED_AFTER_S`` + 30 s; both clear when it
resumes. A worker killed under ``./dev run`` is started again by run_all,
the other processes stay up, and a launch in flight completes.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from typing import Any

import psutil
import pytest
import requests
from google.protobuf import json_format

from notifications import services as notification_services
from notifications.models import Delivery, DeliveryStatus, Event
from tests import factories
from tests.system.e2e.conftest import System, eventually
from tests.system.e2e.test_walkthrough import _signed_in
from workunits.models import DeadLetter, WorkUnitExecution
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db(transaction=True)

#: Four tries, 1-4 s apart: the dead letter comes some 10 s after the launch.
#: A short lease: a task the killed worker held is re-sent within seconds.
#: A dead process is started again 8 s after it died: long enough to see the pages' "not running" banner.
#: Failure messages wait out a 2 s coalescing window (30 s by default), so the message can be
#: delivered within 10 s of the dead letter.
SYSTEM_ENV = {"XMC_ACTUATOR_MAX_RETRIES": "3", "XMC_ACTUATOR_BACKOFF_BASE_S": "2",
              "XMC_ACTUATOR_BACKOFF_MAX_S": "4", "XMC_OPERATION_LEASE_S": "15", "XMC_DEGRADED_AFTER_S": "15",
              "XMC_RUN_RESTART_BASE_S": "8", "XMC_NOTIFY_COALESCE_S": "2"}
DEGRADED_AFTER_S = 15
ADMIN = "admin@example.com"


def _call(system: System, method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {system.exports['XMC_AUTH_TOKEN']}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def _simulator(system: System) -> str:
    kubeconfig = (system.run_dir / "kubeconfig").read_text()
    found = re.search(r"server:\s*(\S+)", kubeconfig)
    assert found, kubeconfig
    return found.group(1).strip("'\"")


class Stream:
    """The experiment page's live stream (SSE), read on a thread: which unit events arrived, and when."""

    def __init__(self, system: System, xid: int) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.response = requests.get(f"{system.exports['XMANAGER_UI_URL']}/experiments/{xid}/events", stream=True,
                                     timeout=60, headers={"Authorization": f"Bearer {system.exports['XMC_AUTH_TOKEN']}"})
        assert self.response.status_code == 200
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        name = ""
        try:
            for line in self.response.iter_lines(decode_unicode=True):
                if line.startswith("event:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and name.startswith("wu-"):
                    self.events.append((time.monotonic(), json.loads(line.split(":", 1)[1])))
        except Exception:
            return


def test_it_shows_a_create_the_cluster_refuses_while_it_retries_and_fails_it_with_the_reason(system: System) -> None:
    simulator = _simulator(system)
    requests.post(f"{simulator}/sim/faults", json={"rules": [
        {"action": "error", "verb": "create", "resource": "jobsets", "status": 500}]}, timeout=10).raise_for_status()
    notification_services.create(Identity(ADMIN), {"events": ["WORK_UNIT_FAILED"], "allMyExperiments": True, "email": {}})
    try:
        experiment = _call(system, "POST", f"{system.api}/v1/experiments", {"title": "refused"})
        xid = int(experiment["name"].rsplit("/", 1)[1])
        stream = Stream(system, xid)
        launched = time.monotonic()
        _call(system, "POST", f"{system.api}/v1/experiments/{xid}/workUnits",
              json_format.MessageToDict(factories.work_unit_message()))

        def warning() -> str | None:
            ex = WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, eid=1).first()
            message = (ex.system_message or {}) if ex is not None else {}
            return message.get("userFacingText") if message.get("severity") == "WARNING" else None

        text = eventually(warning, timeout=30, what="the retrying warning")
        assert text.startswith("the cluster refused the JobSet ") and "Kubernetes API 500" in text
        assert "retrying in" in text and time.monotonic() - launched < 30

        letter = eventually(lambda: DeadLetter.objects.filter(operation__experiment_id=xid).first(), timeout=60,
                            what="the dead letter")
        dead_at = time.monotonic()
        ex = WorkUnitExecution.objects.get(work_unit__experiment_id=xid, eid=1)
        assert ex.state == "FAILED"  # in the dead letter's own transaction
        assert ex.system_message["severity"] == "ERROR"
        assert re.match(r"the cluster refused the JobSet 4 times over \S+: Kubernetes API 500",
                        ex.system_message["userFacingText"]), ex.system_message
        assert ex.system_message["userFacingText"].endswith("an operator can re-queue it")
        assert letter.attempts == 4

        def failed_event() -> bool:
            return any(e.get("new") == "FAILED" for _, e in stream.events)

        eventually(failed_event, timeout=10, what="the live FAILED event on the page's stream")
        assert Event.objects.filter(type="WORK_UNIT_FAILED", xid=xid, wid=1, eid=1).exists()
        # The message is delivered (./dev run writes emails into the run folder), with the reason.
        sent = eventually(lambda: Delivery.objects.filter(xid=xid, type="WORK_UNIT_FAILED",
                                                          status=DeliveryStatus.DELIVERED).first(),
                          timeout=10, what="the failure message delivered")
        assert "the cluster refused the JobSet" in sent.body
        assert time.monotonic() - dead_at < 10
        assert any(e.get("new") == "INITIALIZING" for _, e in stream.events)  # the warning reached the page too
    finally:
        requests.delete(f"{simulator}/sim/faults", timeout=10)


def _worker_leader(system: System) -> psutil.Process:
    """The celery worker run_all started for this system (its process group's leader)."""
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            environ = proc.info["environ"] or {}
        except (psutil.Error, TypeError):
            continue
        if environ.get("XMC_RUN_DIR") == str(system.run_dir) and "celery" in cmdline and " worker" in cmdline \
                and os.getpgid(proc.pid) == proc.pid:
            return proc
    raise AssertionError("no worker of this system is running")


def test_it_restarts_a_killed_worker_and_completes_a_launch_in_flight(system: System) -> None:
    worker = _worker_leader(system)
    experiment = _call(system, "POST", f"{system.api}/v1/experiments", {"title": "worker killed"})
    xid = int(experiment["name"].rsplit("/", 1)[1])
    os.killpg(worker.pid, signal.SIGKILL)
    _call(system, "POST", f"{system.api}/v1/experiments/{xid}/workUnits",
          json_format.MessageToDict(factories.work_unit_message()))
    # The pages stay up while the worker is down, and say so.
    ui = system.exports["XMANAGER_UI_URL"]
    assert requests.get(f"{ui}/healthz", timeout=10).status_code == 200
    pages = _signed_in_as_admin(system)
    banner = eventually(lambda: re.search(r'<p class="degraded" role="status">([^<]*)</p>',
                                          pages.get(f"{ui}/experiments/{xid}", timeout=10).text),
                        timeout=8, what="the worker-down banner")
    assert banner[1].startswith("the worker is not running (for ") and "launches, stops and notifications" in banner[1]

    def restarted() -> bool:
        log = system.log("worker")
        return "worker exited with code -9; restarting it in" in log and "worker restarted" in log

    eventually(restarted, timeout=30, what="run_all restarting the worker")
    assert _worker_leader(system).pid != worker.pid
    eventually(lambda: "is not running" not in pages.get(f"{ui}/experiments/{xid}", timeout=10).text,
               timeout=10, what="the banner gone once the worker is back")

    def carried_out() -> str | None:
        ex = WorkUnitExecution.objects.filter(work_unit__experiment_id=xid, eid=1).first()
        return ex.state if ex is not None and ex.state not in ("INITIALIZING", "FAILED") else None

    eventually(carried_out, timeout=120, what="the create carried out by the restarted worker")


def _signed_in_as_admin(system: System) -> requests.Session:
    from django.contrib.auth.models import User

    if not User.objects.filter(username="admin").exists():  # an earlier test's flush took run_all's admin
        User.objects.create_superuser("admin", ADMIN, os.environ.get("XMC_ADMIN_PASSWORD", "admin"))
    return _signed_in(system.exports["XMANAGER_UI_URL"])


def test_it_turns_readyz_degraded_and_shows_the_banner_for_a_frozen_worker_until_it_resumes(system: System) -> None:
    worker = _worker_leader(system)
    ui = system.exports["XMANAGER_UI_URL"]
    pages = _signed_in_as_admin(system)
    experiment = _call(system, "POST", f"{system.api}/v1/experiments", {"title": "worker frozen"})
    xid = int(experiment["name"].rsplit("/", 1)[1])
    os.killpg(worker.pid, signal.SIGSTOP)
    try:
        frozen_at = time.monotonic()
        _call(system, "POST", f"{system.api}/v1/experiments/{xid}/workUnits",
              json_format.MessageToDict(factories.work_unit_message()))

        def degraded() -> dict[str, Any] | None:
            answer = requests.get(f"{ui}/readyz", timeout=10)
            assert answer.status_code == 200  # the web still serves
            delivery = answer.json()["delivery"]
            return delivery if delivery["status"] == "degraded" else None

        delivery = eventually(degraded, timeout=DEGRADED_AFTER_S + 30, what="/readyz degraded")
        assert delivery["oldestPendingSeconds"] >= DEGRADED_AFTER_S
        eventually(lambda: 'class="degraded"' in pages.get(f"{ui}/experiments", timeout=10).text,
                   timeout=DEGRADED_AFTER_S + 30 - (time.monotonic() - frozen_at) + 10, what="the banner")
        page = pages.get(f"{ui}/experiments", timeout=10).text
        assert "work is waiting for a worker: oldest" in page
    finally:
        os.killpg(worker.pid, signal.SIGCONT)
    eventually(lambda: requests.get(f"{ui}/readyz", timeout=10).json()["delivery"]["status"] == "ok", timeout=60,
               what="/readyz ok again")
    eventually(lambda: 'class="degraded"' not in pages.get(f"{ui}/experiments", timeout=10).text, timeout=30,
               what="the banner gone")
