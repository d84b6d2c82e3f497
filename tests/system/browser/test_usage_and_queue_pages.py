"""/usage and /queues as people use them, in Debian's Chromium over the real ASGI server.

/usage: Alice sees her GPU-hours (a preempted job counts only its running time), grouped
by experiment and by queue; Olivia (staff) sees everyone's. /queues: the simulated Kueue
with admitted and pending work; the page's counts and quota are Kueue's, the pending list
names Alice's work units and hides Bob's from her. 390 px and 1440 px without horizontal
scrolling or a CSP violation; screenshots into docs/screenshots/.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from k8s_bridge import client
from tests import factories
from tests.fixtures.browsers import needs_chromium
from tests.fixtures.simulators import Cluster
from tests.k8s_bridge.reconciler.test_end_to_end import small_queue
from tests.system.browser.test_researcher_pages import SHOTS, _signed_in  # noqa: F401
from tests.system.browser.test_subscription_pages import _fits
from tests.ui import pages
from tests.usage.worlds import gpu_unit, move, run
from tests.waiting import eventually

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]
ALICE, BOB = "alice@example.com", "bob@example.com"


def _suffix(width: int) -> str:
    return "desktop" if width > 400 else "phone"


@pytest.mark.parametrize("width", [390, 1440])
def test_it_shows_gpu_hours_of_running_time_to_their_owner_and_everyones_to_staff_in_usage(
        browser: Any, site: str, width: int) -> None:
    from datetime import datetime, timedelta, timezone

    pages.person("alice")
    olivia = pages.person("olivia")
    User.objects.filter(pk=olivia.pk).update(is_staff=True)
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    exp = factories.experiment(ALICE, title="resnet50 on 8 GPUs")
    unit = gpu_unit(exp, gpus=8)
    run(unit, today - timedelta(days=2))
    move(unit, "DESCHEDULING", today - timedelta(days=2) + timedelta(hours=3))     # preempted after 3 h
    move(unit, "SCHEDULING", today - timedelta(days=2) + timedelta(hours=3, minutes=1))
    move(unit, "RUNNING", today - timedelta(days=1))
    move(unit, "COMPLETED", today - timedelta(days=1) + timedelta(hours=1))        # 1 h more
    run(gpu_unit(factories.experiment(BOB, title="bob's probe"), gpus=2, queue="demo-queue"),
        today - timedelta(days=1), today - timedelta(days=1) + timedelta(hours=2))

    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)
    page.click("header.top a[href='/usage']")
    page.wait_for_url(f"{site}/usage")
    table = page.inner_text("#usage")
    assert ALICE in table and BOB not in table
    assert "32.0" in table                                   # 8 GPUs x (3 h + 1 h)
    page.select_option("select[name=groupBy]", "experiment")
    page.click("#usage-query button[type=submit]")
    page.wait_for_url(f"{site}/usage?*")
    assert "resnet50 on 8 GPUs" in page.inner_text("#usage")
    _fits(page, width)
    assert not page.csp_errors  # type: ignore[attr-defined]
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"usage-{_suffix(width)}.png"), full_page=True)
    # A bad period is said on the page, not a server error.
    page.goto(f"{site}/usage?from=2026-02-30")
    assert "from must be a date" in page.inner_text("#usage-error")
    page.close()

    staff = _signed_in(browser, site, "olivia", width=width)
    staff.goto(f"{site}/usage?groupBy=queue")
    table = staff.inner_text("#usage")
    assert "gpu-queue" in table and "demo-queue" in table and "36.0" in table   # total: 32 + 4
    staff.close()


@pytest.mark.parametrize("width", [390, 1440])
def test_it_shows_kueues_numbers_and_the_pending_work_in_order_in_queues(
        browser: Any, site: str, make_cluster: Callable[..., Cluster], width: int) -> None:  # noqa: F811
    cluster = make_cluster(clusterQueues=small_queue("2"))
    pages.person("alice")
    alice, bob = factories.experiment(ALICE, title="resnet sweep"), factories.experiment(BOB, title="bob's")
    units = [factories.work_unit(alice) for _ in range(3)]
    theirs = factories.work_unit(bob)
    for unit in units[:2]:
        cluster.create_jobset(unit, script="pull=0s;run=forever")

    def cq() -> dict[str, Any]:
        return dict(client.custom_objects().get_cluster_custom_object(
            client.KUEUE_GROUP, client.KUEUE_VERSION, "clusterqueues", "cluster-queue"))

    def queue_and_workloads() -> str:
        """What Kueue says, for a wait that times out: the queue's counts and each Workload's conditions."""
        wls = client.custom_objects().list_namespaced_custom_object(
            client.KUEUE_GROUP, client.KUEUE_VERSION, "default", client.WORKLOAD_PLURAL)["items"]
        conds = {w["metadata"]["name"]: [(c["type"], c["status"], c.get("reason"))
                                         for c in (w.get("status") or {}).get("conditions") or []] for w in wls}
        status = cq().get("status", {})
        return f"queue: {({k: v for k, v in status.items() if k.endswith('Workloads')})}\nworkloads: {conds}"
    eventually(lambda: cq().get("status", {}).get("admittedWorkloads") == 2, what="two admitted",
               detail=queue_and_workloads)
    cluster.create_jobset(units[2], script="pull=0s;run=forever")
    eventually(lambda: cq()["status"].get("pendingWorkloads") == 1, what="one pending", detail=queue_and_workloads)
    cluster.create_jobset(theirs, script="pull=0s;run=forever")
    status = eventually(lambda: cq()["status"].get("pendingWorkloads") == 2 and cq()["status"], what="two pending",
                        detail=queue_and_workloads)

    page = _signed_in(browser, site, "alice", width=width, height=900 if width > 400 else 844)
    page.click("header.top a[href='/queues']")
    page.wait_for_url(f"{site}/queues")
    card = page.inner_text("#cq-cluster-queue")
    assert f"{status['admittedWorkloads']} admitted" in card and f"{status['pendingWorkloads']} pending" in card
    cpu = next(r for r in status["flavorsReservation"][0]["resources"] if r["name"] == "cpu")
    row = page.inner_text("#cq-cluster-queue table.quota tbody tr:first-child")
    assert "cpu" in row and cpu["total"] in row
    rows = page.locator("#pending-workloads tbody tr")
    assert rows.count() == 2
    assert f"{alice.id}/{units[2].wid}" in rows.nth(0).inner_text() and "you" in rows.nth(0).inner_text()
    assert "not yours to see" in rows.nth(1).inner_text()
    assert "unknown" in rows.nth(0).inner_text()
    _fits(page, width)
    assert not page.csp_errors  # type: ignore[attr-defined]
    page.screenshot(path=str(SHOTS / f"queues-{_suffix(width)}.png"), full_page=True)
    page.close()
