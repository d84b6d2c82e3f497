"""Crash safety and broker outages: nothing committed is lost or done twice, with the default settings.

The database is the truth and the broker a doorbell (``workunits.delivery``):
a sent operation that is not done after its lease, with no live claim, is
sent again by the beat sweep, and the worker that runs it claims the row.

* A worker SIGKILLed in the middle of creates, stops and restarts: what it
  held is lost with it (Redis would hand it back only after the one-hour
  visibility timeout); its claims run out and the sweep re-sends. Default
  lease and sweep interval: healed well within 2 minutes, every operation
  done once, never a JobSet created twice (the simulator counts creates).
* Redis restarted empty with creates queued: the same, with the defaults.
* A worker killed while a Restart waits for the old JobSet to go: a short
  lease (the mechanism, quickly) and the next worker takes the claim over.
* Redis down while a create commits: the publish fails, the row stays in the
  outbox (no ``dispatched_time``), repeated failures put a FATAL message on the
  execution, and once Redis is back the beat sweep carries the create out.

The tests that need to kill Redis run their own ``redis-server`` on a free port
(never the shared one).
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.db import close_old_connections
from django.utils import timezone
from kombu import pools as kombu_pools

from core.queues import Queue
from jobsets.contract import FINALIZER, LABEL_EID
from k8s_bridge import client
from tests import factories
from tests.k8s_bridge.actuator.conftest import NAMESPACE, REAL_DELIVER, Workers, get_jobset
from tests.ports import free_port
from tests.waiting import eventually
from workunits import services
from workunits.models import DeadLetter, Operation, WorkUnitExecution
from xmc.celery import app

pytestmark = pytest.mark.django_db(transaction=True)

#: What "heals within 2 minutes" means for the tests run with the default settings.
HEAL_S = 120

#: The worker settings the other actuator tests shorten; these tests run without them.
DEFAULTS = {"XMC_ACTUATOR_BACKOFF_BASE_S": "1.0", "XMC_ACTUATOR_BACKOFF_MAX_S": "60.0"}


def _done(ids: list[int]) -> int:
    close_old_connections()
    return Operation.objects.filter(id__in=ids, done=True).count()


def _creates(api_cluster: Any, xid: int) -> dict[tuple[str, str], int]:
    """(JobSet name, eid) -> how many times the simulator created it, for experiment ``xid``."""
    prefix = f"xmc-{xid}-"
    return {(name, eid): n for (plural, _, name, eid), n in list(api_cluster.store.creates.items())
            if plural == "jobsets" and name.startswith(prefix)}


class FinalizerPath:
    """What the reconciler's finalizer path does last, in the background: let deleted JobSets go."""

    def __init__(self, api_cluster: Any) -> None:
        self.cluster = api_cluster
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.paused = threading.Event()

    def __enter__(self) -> FinalizerPath:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            if self.paused.is_set():
                continue
            for obj in self.cluster.store.list("jobsets", NAMESPACE)[0]:  # the store itself: no faults
                meta = obj["metadata"]
                if meta.get("deletionTimestamp") and FINALIZER in (meta.get("finalizers") or []):
                    try:
                        client.custom_objects().patch_namespaced_custom_object(
                            client.JOBSET_GROUP, client.JOBSET_VERSION, NAMESPACE, client.JOBSET_PLURAL,
                            meta["name"], {"metadata": {"finalizers": None}})
                    except Exception:  # noqa: BLE001 - injected API faults: the next round tries again
                        pass


def test_it_heals_with_the_defaults_a_worker_killed_holding_creates_stops_and_restarts(
    workers: Workers, api_cluster: Any
) -> None:
    first = workers.start(concurrency=2, beat=True, **DEFAULTS)
    exp = factories.experiment()
    with FinalizerPath(api_cluster) as finalizers:
        running = [services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(40)]
        eventually(lambda: _done(running) == 40, timeout=120, what="the first 40 creates")
        # The old JobSets stay while the worker dies: it surely holds the Restarts (waiting, claimed).
        finalizers.paused.set()
        ops: list[int] = []
        for wid in range(1, 61):  # interleaved: the worker holds some of each kind when it dies
            ops.append(services.create_work_unit(exp.id, factories.work_unit_message()).id)
            if wid > 40:
                continue
            if wid <= 20:
                ops.append(services.stop_work_units(exp.id, [wid], batch=False).id)
            else:
                ops.append(services.restart_work_units(exp.id, [wid], batch=False).id)
        restarts = list(Operation.objects.filter(id__in=ops, task_type="RESTART").values_list("id", flat=True))
        eventually(lambda: Operation.objects.filter(id__in=restarts).exclude(claimed_by="").count() >= 5,
                   timeout=120, what="restarts waiting under a claim")
        workers.kill(first)
        killed_at = time.monotonic()
        assert _done(ops) < len(ops), "the mix finished before the kill; nothing was tested"
        finalizers.paused.clear()
        workers.start(concurrency=2, beat=True, **DEFAULTS)
        eventually(lambda: _done(ops) == len(ops), timeout=HEAL_S, what="every operation of the mix")
        healed_s = time.monotonic() - killed_at
    print(f"healed {healed_s:.1f} s after the kill")
    assert healed_s < HEAL_S

    finished = Operation.objects.filter(id__in=ops + running)
    assert all(op.error is None and op.end_time is not None for op in finished)
    assert not DeadLetter.objects.exists()
    creates = _creates(api_cluster, exp.id)
    assert all(n == 1 for n in creates.values()), {k: n for k, n in creates.items() if n > 1}
    expected = {(f"xmc-{exp.id}-{wid}", "1") for wid in range(1, 101)} | \
        {(f"xmc-{exp.id}-{wid}", "2") for wid in range(21, 41)}
    assert set(creates) == expected
    for wid in range(1, 21):  # stopped: gone
        assert get_jobset(api_cluster, exp.id, wid) is None
    for wid in range(21, 41):  # restarted: eid 2 runs
        assert get_jobset(api_cluster, exp.id, wid)["metadata"]["labels"][LABEL_EID] == "2"


def test_it_takes_over_a_worker_killed_while_a_restart_waits(workers: Workers, api_cluster: Any) -> None:
    """A short lease: the mechanism itself, quickly (the defaults are the test above)."""
    short = {"XMC_OPERATION_LEASE_S": "3", "XMC_OUTBOX_SWEEP_INTERVAL_S": "1"}
    first = workers.start(concurrency=1, beat=True, **short)
    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    eventually(lambda: _done([create]) == 1, timeout=60, what="the create")
    restart = services.restart_work_units(exp.id, [1], batch=False).id

    def waiting() -> Operation | None:
        close_old_connections()
        row = Operation.objects.get(id=restart)
        jobset = get_jobset(api_cluster, exp.id, 1)
        return row if row.claimed_by and jobset and jobset["metadata"].get("deletionTimestamp") else None

    held = eventually(waiting, timeout=60, what="the restart waiting for the old JobSet")
    # Rounds of waiting extend the claim: wait until its first lease would have run out a sweep
    # interval ago (a sweep has looked at it since), not a fixed 4 s.
    assert held.claimed_until is not None
    lapsed = held.claimed_until + timedelta(seconds=float(short["XMC_OUTBOX_SWEEP_INTERVAL_S"]) + 0.5)
    time.sleep(max(0.0, (lapsed - timezone.now()).total_seconds()))
    close_old_connections()
    row = Operation.objects.get(id=restart)
    assert row.claimed_until is not None and row.claimed_until > lapsed, "the claim was not extended"
    assert not row.done and row.claimed_by == held.claimed_by
    assert row.dispatched_time == held.dispatched_time, "re-sent while its claim was live"
    workers.kill(first)
    with FinalizerPath(api_cluster):  # the old JobSet goes while nobody is there
        eventually(lambda: get_jobset(api_cluster, exp.id, 1) is None, timeout=30, what="the old JobSet gone")
        workers.start(concurrency=1, beat=True, **short)
        eventually(lambda: _done([restart]) == 1, timeout=60, what="the restart, taken over")
    row = Operation.objects.get(id=restart)
    assert row.error is None and row.claimed_by != held.claimed_by
    assert _creates(api_cluster, exp.id) == {(f"xmc-{exp.id}-1", "1"): 1, (f"xmc-{exp.id}-1", "2"): 1}
    assert get_jobset(api_cluster, exp.id, 1)["metadata"]["labels"][LABEL_EID] == "2"


def test_it_changes_nothing_on_duplicates_of_every_task(workers: Workers, api_cluster: Any) -> None:
    """Each create sent three times, to two worker processes at once: each JobSet created once."""
    from workunits import outbox

    exp = factories.experiment()
    ops = [services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(30)]
    for _ in range(2):
        outbox.deliver(ops)  # the sweep's path: two more copies of every task in the queue
    workers.start(concurrency=2)
    eventually(lambda: _done(ops) == 30, timeout=120, what="the 30 creates")

    def drained() -> bool:
        """No copy left on the queue, and none taken and unfinished (acks_late: a task is acked at its end)."""
        broker = redis.Redis.from_url(workers.broker)
        try:
            return broker.llen(Queue.ACTUATOR.value) == 0 and broker.hlen("unacked") == 0
        finally:
            broker.close()

    eventually(drained, timeout=60, what="the last copies taken and dropped")
    creates = _creates(api_cluster, exp.id)
    assert set(creates) == {(f"xmc-{exp.id}-{wid}", "1") for wid in range(1, 31)}
    assert all(n == 1 for n in creates.values())
    assert not DeadLetter.objects.exists()


class PrivateRedis:
    def __init__(self, port: int, workdir: str) -> None:
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed for this test"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


@pytest.fixture
def private_redis(tmp_path: Any) -> Iterator[PrivateRedis]:
    r = PrivateRedis(free_port(), str(tmp_path))
    r.start()
    yield r
    r.stop()


def _use_broker(url: str | None, write_url: str | None) -> None:
    """Point this process's Celery producer at ``url`` (the worker gets it by env)."""
    app.pool.force_close_all()
    app.conf.broker_url = url
    app.conf.broker_write_url = write_url
    app._pool = None
    app.amqp._producer_pool = None
    kombu_pools.reset()  # the global producer pools keyed by connection


@pytest.fixture
def private_broker(private_redis: PrivateRedis) -> Iterator[PrivateRedis]:
    old = (app.conf.broker_url, app.conf.broker_write_url)
    _use_broker(private_redis.url, private_redis.url)
    yield private_redis
    _use_broker(*old)


def test_it_carries_out_a_create_committed_while_redis_was_down(
    workers: Workers, api_cluster: Any, private_broker: PrivateRedis, settings: Any
) -> None:
    exp = factories.experiment()
    private_broker.stop()
    op = services.create_work_unit(exp.id, factories.work_unit_message())  # on commit: publish fails
    row = Operation.objects.get(id=op.id)
    assert row.dispatched_time is None and row.dispatch_attempts == 1 and not row.done

    # The sweep's next tries fail too: the execution is told, FATAL for a create.
    for _ in range(settings.XMC_OUTBOX_FAILURES_BEFORE_MESSAGE - 1):
        REAL_DELIVER([op.id])
    ex = WorkUnitExecution.objects.get(work_unit_id=op.work_unit_id, eid=1)
    assert ex.system_message["severity"] == "FATAL"
    assert "actuator" in ex.system_message["userFacingText"]

    private_broker.start()
    workers.start(concurrency=1, beat=True, broker=private_broker.url,
                  XMC_OUTBOX_SWEEP_INTERVAL_S="1", XMC_OUTBOX_SWEEP_MIN_AGE_S="0")

    def finished() -> Operation | None:
        close_old_connections()
        row = Operation.objects.get(id=op.id)
        return row if row.done else None

    done = eventually(finished, timeout=120, what="the swept create")
    assert done.error is None and done.dispatched_time is not None
    assert get_jobset(api_cluster, exp.id, 1) is not None


def test_it_loses_nothing_with_the_defaults_when_redis_restarts_empty_with_creates_queued(
    workers: Workers, api_cluster: Any, private_broker: PrivateRedis
) -> None:
    exp = factories.experiment()
    ops = [services.create_work_unit(exp.id, factories.work_unit_message()).id for _ in range(30)]
    close_old_connections()
    assert Operation.objects.filter(id__in=ops, dispatched_time__isnull=False).count() == 30  # all on Redis
    private_broker.stop()  # no persistence: every queued task is gone
    private_broker.start()
    restarted_at = time.monotonic()
    workers.start(concurrency=2, beat=True, broker=private_broker.url, **DEFAULTS)
    eventually(lambda: _done(ops) == 30, timeout=HEAL_S, what="the 30 creates lost with Redis")
    healed_s = time.monotonic() - restarted_at
    print(f"healed {healed_s:.1f} s after the restart")
    assert healed_s < HEAL_S
    assert all(op.error is None for op in Operation.objects.filter(id__in=ops))
    creates = _creates(api_cluster, exp.id)
    assert creates == {(f"xmc-{exp.id}-{wid}", "1"): 1 for wid in range(1, 31)}
