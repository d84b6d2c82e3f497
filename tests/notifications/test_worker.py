"""A real Celery worker on the ``notifications`` queue: killed mid-delivery and restarted,
it sends again with the same webhook-id and no second event; and a work unit failing in
the simulator, seen by the reconciler, gives exactly one delivery per subscription."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from notifications import services
from notifications.models import Delivery, DeliveryStatus, Event
from tests import factories
from tests.celery_workers import CeleryWorkers
from tests.notifications.helpers import fail
from tests.k8s_bridge.reconciler.conftest import make_reconciler, reconciler  # noqa: F401 - fixtures
from tests.waiting import eventually
from xmc.auth.identity import Identity

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def start_worker(celery_workers: CeleryWorkers) -> Callable[[], subprocess.Popen[bytes]]:
    """A ``notifications`` worker (tests/celery_workers.py) with short leases and no coalescing."""
    return lambda: celery_workers.start("notifications", env={
        "XMC_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1", "XMC_NOTIFY_LEASE_S": "3", "XMC_NOTIFY_COALESCE_S": "0",
        "XMC_WEBHOOK_TIMEOUT_S": "60", "XMC_NOTIFY_BACKOFF_S": "1"})


def _sweep() -> dict[str, int]:
    """What beat does every XMC_OUTBOX_SWEEP_INTERVAL_S: the one delivery sweep hands due and
    lease-expired deliveries to the queue (how many rows of each table it re-sent)."""
    from delivery import sweep

    return sweep.sweep()


def test_it_retries_with_the_same_webhook_id_and_no_second_event_when_a_worker_is_killed_mid_delivery(
        broker: Any, receiver: Any, start_worker: Any, tmp_path: Path) -> None:
    exp = factories.experiment()
    created = services.create(Identity(factories.ALICE), {"experiment": f"experiments/{exp.id}",
                                                          "events": ["WORK_UNIT_FAILED"],
                                                          "webhook": {"url": receiver.url}})
    receiver.secret = created.secret
    receiver.hang_s = 120  # the first request hangs: the worker is busy sending when it dies
    first = start_worker()
    fail(factories.work_unit(exp))
    eventually(lambda: len(receiver.requests) == 1, timeout=60, what="the first try reached the receiver")
    assert Delivery.objects.get().status == DeliveryStatus.DELIVERING
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    start_worker()
    # The sweep re-sends it once the dead worker's lease (3 s) has run out: sweep until it does.
    eventually(lambda: _sweep()["notification deliveries"] == 1, timeout=30, what="the sweep re-sending it")
    eventually(lambda: Delivery.objects.get().status == DeliveryStatus.DELIVERED, timeout=90,
               what="the retry delivered (worker log: " + str(tmp_path) + ")")
    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(ids) == 2 and len(set(ids)) == 1  # a retry of the same message, not a second event
    assert all(r.verified for r in receiver.requests)
    assert receiver.requests[0].body == receiver.requests[1].body
    assert _sweep()["notification deliveries"] == 0  # more sweeps send nothing again
    time.sleep(0.5)
    assert len(receiver.requests) == 2
    assert Delivery.objects.count() == 1 and Delivery.objects.get().attempts == 2


def test_it_gives_exactly_one_delivery_per_subscription_for_a_work_unit_failing_in_the_simulator(
        broker: Any, receiver: Any, smtp: Any, start_worker: Any, cluster: Any, reconciler: Any) -> None:
    from tests.k8s_bridge.reconciler.conftest import state_of
    from workunits.choices import WorkUnitState

    exp = factories.experiment()
    wu = factories.work_unit(exp)
    created = services.create(Identity(factories.ALICE), {"experiment": f"experiments/{exp.id}",
                                                          "events": ["WORK_UNIT_FAILED"],
                                                          "webhook": {"url": receiver.url}})
    receiver.secret = created.secret
    services.create(Identity(factories.ALICE), {"allMyExperiments": True, "events": ["WORK_UNIT_FAILED"],
                                                "email": {}})
    start_worker_env = start_worker
    os.environ["EMAIL_HOST"], os.environ["EMAIL_PORT"] = "127.0.0.1", str(smtp.port)
    try:
        start_worker_env()
    finally:
        del os.environ["EMAIL_HOST"], os.environ["EMAIL_PORT"]
    cluster.create_jobset(wu, script="pull=1s;run=2s;exit=1")
    eventually(lambda: state_of(wu) == WorkUnitState.FAILED, timeout=120, what="FAILED in the simulator")
    eventually(lambda: len(receiver.requests) == 1 and len(smtp.messages) == 1, timeout=60,
               what="one webhook and one email")
    # Nothing more is on its way: every event fanned out, both deliveries done, and the sweep finds
    # nothing to send again.
    eventually(lambda: Delivery.objects.filter(done=True).count() == 2, timeout=30, what="both deliveries done")
    assert not Event.objects.filter(done=False).exists()
    assert _sweep()["notification deliveries"] == 0
    time.sleep(0.5)
    assert len(receiver.requests) == 1 and len(smtp.messages) == 1
    assert receiver.requests[0].verified
    assert receiver.requests[0].json["data"]["workUnits"][0]["name"] == f"experiments/{exp.id}/workUnits/{wu.wid}"
    assert Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 2


@pytest.fixture
def refusing_database() -> Iterator[Callable[[], None]]:
    """Postgres refuses to move a delivery to DELIVERING (a trigger raising in the deliver task's claim
    transaction: a database error the worker sees, the way a failover or a full disk would show); the
    callable ends the refusal."""
    from django.db import connection

    def stop() -> None:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS xmc_test_refuse ON notifications_delivery")
            cursor.execute("DROP FUNCTION IF EXISTS xmc_test_refuse()")

    with connection.cursor() as cursor:
        cursor.execute("CREATE FUNCTION xmc_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                       "$$ BEGIN RAISE EXCEPTION 'the database refused the write (test)'; END $$")
        cursor.execute("CREATE TRIGGER xmc_test_refuse BEFORE UPDATE OF status ON notifications_delivery "
                       "FOR EACH ROW WHEN (NEW.status = 'DELIVERING') EXECUTE FUNCTION xmc_test_refuse()")
    try:
        yield stop
    finally:
        stop()


def test_it_retries_a_database_error_in_a_delivery_batch_by_consumes_policy_holding_the_claim_through_the_countdown(
        broker: Any, receiver: Any, start_worker: Any, celery_workers: CeleryWorkers,
        refusing_database: Callable[[], None]) -> None:
    """The deliver task runs through ``delivery.consume.consume_many``: a database error is retried with
    ``delivery.backoff.jittered`` (not Celery's autoretry), the batch's claim is pushed past the countdown
    so the sweep sends no copy meanwhile, and the retry (the same task id) takes the rows again."""
    from django.utils import timezone

    exp = factories.experiment()
    created = services.create(Identity(factories.ALICE), {"experiment": f"experiments/{exp.id}",
                                                          "events": ["WORK_UNIT_FAILED"],
                                                          "webhook": {"url": receiver.url}})
    receiver.secret = created.secret
    worker = start_worker()
    fail(factories.work_unit(exp))
    eventually(lambda: "delivery.retry" in celery_workers.log(worker), timeout=60, what="the task retrying",
               detail=lambda: celery_workers.log(worker)[-3000:])
    row = Delivery.objects.get()
    lease_s = 3.0  # the worker's XMC_NOTIFY_LEASE_S
    # Held by the retrying task through its countdown (>= 0.5 s, then a lease): no copy from the sweep.
    assert row.status == DeliveryStatus.PENDING and row.attempts == 0  # the refused claim rolled back
    assert row.claimed_by and row.claimed_until is not None
    assert row.claimed_until > timezone.now() + timedelta(seconds=lease_s / 2)
    Delivery.objects.filter(id=row.id).update(next_attempt_time=timezone.now() - timedelta(minutes=1))
    assert _sweep()["notification deliveries"] == 0
    refusing_database()  # the database is back
    eventually(lambda: Delivery.objects.get().status == DeliveryStatus.DELIVERED, timeout=60,
               what="the retry delivered", detail=lambda: celery_workers.log(worker)[-3000:])
    row = Delivery.objects.get()
    assert len(receiver.requests) == 1 and receiver.requests[0].verified
    assert row.attempts == 1 and row.claimed_until is None
    first_retry = next(line for line in celery_workers.log(worker).splitlines() if "delivery.retry" in line)
    countdown = float(re.search(r"countdown=([0-9.]+)", first_retry).group(1))  # type: ignore[union-attr]
    assert 0.5 <= countdown <= 1.0  # the first retry's jittered backoff: uniform in [1/2, 1] s
