"""One active reconciler: Lease election, failover after SIGKILL, lost lease, restart convergence."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from k8s_bridge import client
from k8s_bridge.reconciler.leader import LeaderElector
from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, state_of
from tests.waiting import eventually
from tests.childenv import child_database_url
from workunits.choices import WorkUnitState

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState
ROOT = Path(__file__).resolve().parents[3]
LEASE = "xmc-reconciler"


def holder() -> str:
    try:
        return client.coordination().read_namespaced_lease(LEASE, "default").spec.holder_identity or ""
    except client.ApiException as exc:
        if exc.status == 404:
            return ""
        raise


@pytest.fixture
def spawn(cluster: Cluster, tmp_path: Path):
    procs: dict[str, subprocess.Popen[bytes]] = {}
    db = connection.settings_dict

    def ready(identity: str) -> bool:
        return f"{identity} watching".encode() in (tmp_path / f"{identity}.log").read_bytes()

    def start(identity: str, wait: bool = True) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update({
            "KUBECONFIG": cluster.handle.kubeconfig_path or "",
            "DATABASE_URL": child_database_url(),
            "XMC_RECONCILER_FLUSH_INTERVAL_MS": "50",
            "XMC_RECONCILER_RESYNC_S": "5",
            "XMC_LOG_LEVEL": "WARNING",
        })
        log = open(tmp_path / f"{identity}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "reconcile", "--identity", identity, "--lease-duration", "3",
             "--metrics-port", "-1"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        procs[identity] = proc
        if wait:
            eventually(lambda: ready(identity) or proc.poll() is not None, timeout=120, what=f"{identity} started")
            assert proc.poll() is None, (tmp_path / f"{identity}.log").read_text()
        return proc

    yield start
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_it_fails_over_to_the_standby_when_the_leader_is_killed(cluster: Cluster, spawn) -> None:
    first = spawn("rec-a")
    eventually(lambda: holder() == "rec-a", what="rec-a leads")
    standby = spawn("rec-b")
    exp = factories.experiment()
    done, failed, long = (factories.work_unit(exp) for _ in range(3))
    cluster.create_jobset(done, script="pull=1s;run=30s;exit=0")
    cluster.create_jobset(failed, script="pull=1s;run=40s;exit=1")
    cluster.create_jobset(long, script="pull=1s;run=3000s;exit=0")
    eventually(lambda: all(state_of(wu) == S.RUNNING for wu in (done, failed, long)), what="all RUNNING")
    assert holder() == "rec-a"
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    killed_at = time.monotonic()
    eventually(lambda: holder() == "rec-b", timeout=30, what="rec-b takes the lease")
    # within the lease duration (3 s) plus the standby's retry period, with generous slack for a
    # loaded 2-core machine where a process can wait seconds for the CPU
    assert time.monotonic() - killed_at < 3 + 15
    eventually(lambda: state_of(done) == S.COMPLETED and state_of(failed) == S.FAILED, timeout=90,
               what="final states written by the new leader")
    assert state_of(long) == S.RUNNING
    assert standby.poll() is None


def test_it_stops_cleanly_on_sigterm_and_hands_the_lease_over(cluster: Cluster, spawn) -> None:
    first = spawn("rec-a")
    eventually(lambda: holder() == "rec-a", what="rec-a leads")
    spawn("rec-b")
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    eventually(lambda: holder() == "rec-b", timeout=10, what="released lease taken at once")


def test_it_stops_writing_at_once_when_it_loses_its_lease_as_leader(cluster: Cluster, make_reconciler) -> None:
    elector = LeaderElector("default", LEASE, "me", lease_duration_s=30, renew_period_s=0.2)
    elector.start()
    try:
        eventually(elector.is_leader, what="leading")
        rec = make_reconciler(can_write=elector.is_leader)
        exp = factories.experiment()
        wu = factories.work_unit(exp)
        cluster.create_jobset(wu, script="pull=1s;run=3000s;exit=0")
        eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING while leading")
        lease = client.coordination().read_namespaced_lease(LEASE, "default")
        client.coordination().patch_namespaced_lease(LEASE, "default", {"spec": {"holderIdentity": "thief"}})
        eventually(lambda: not elector.is_leader(), timeout=5, what="leadership dropped")
        assert lease.spec.lease_duration_seconds == 30  # well before the lease would have expired
        other = factories.work_unit(exp)
        cluster.create_jobset(other, script="pull=1s;run=3000s;exit=0")
        # The jobset is admitted and runs meanwhile: the reconciler sees it run, and its write waits.
        eventually(lambda: any(key[:2] == (exp.id, other.wid) and update.state == S.RUNNING
                               for key, update in rec.batcher.pending().items()),
                   timeout=30, what="the reconciler's RUNNING of the other unit, held back")
        rec.batcher.flush()
        assert state_of(other) == S.INITIALIZING
    finally:
        elector.release()


def test_it_converges_within_one_resync_when_restarted(cluster: Cluster, make_reconciler) -> None:
    rec = make_reconciler()
    exp = factories.experiment()
    quick, stopped, long = (factories.work_unit(exp) for _ in range(3))
    for wu in (quick, stopped, long):
        cluster.create_jobset(wu, script="pull=1s;run=3000s;exit=0" if wu is not quick else "pull=1s;run=20s;exit=0")
    eventually(lambda: all(state_of(wu) == S.RUNNING for wu in (quick, stopped, long)), what="all RUNNING")
    rec.stop(drain=False)  # the process dies
    from workunits import services

    services.stop_work_units(exp.id, [stopped.wid], batch=False)
    cluster.delete_jobset(stopped)  # waits on our finalizer while nobody reconciles
    eventually(lambda: (cluster.jobset(quick) or {}).get("status", {}).get("terminalState") == "Completed",
               timeout=60, what="quick completes while the reconciler is down")
    assert state_of(quick) == S.RUNNING and state_of(stopped) == S.STOPPING
    again = make_reconciler(resync_s=3600)
    eventually(lambda: state_of(quick) == S.COMPLETED and state_of(stopped) == S.STOPPED, timeout=30,
               what="database matches the cluster")
    assert again.resyncs == 1
    eventually(lambda: cluster.jobset(stopped) is None, what="finalizer removed")
    assert state_of(long) == S.RUNNING


def test_it_takes_at_once_a_lease_left_by_a_dead_process_of_this_host(cluster: Cluster) -> None:
    """A reconciler killed under ./dev run is started again on the same host: it must not wait the old lease out."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = f"{socket.gethostname()}-{os.getpid()}-abc123"
    client.coordination().create_namespaced_lease("default", {
        "metadata": {"name": LEASE}, "spec": {"holderIdentity": alive, "leaseDurationSeconds": 30,
                                             "renewTime": "2026-01-01T00:00:00.000000Z"}})
    elector = LeaderElector("default", LEASE, "me", lease_duration_s=30)
    assert not elector.try_acquire_or_renew()  # a holder still running here is waited out
    client.coordination().patch_namespaced_lease(
        LEASE, "default", {"spec": {"holderIdentity": f"{socket.gethostname()}-{gone.pid}-abc123"}})
    assert elector.try_acquire_or_renew()  # its process is gone: taken on the first try
    assert holder() == "me"
    other = LeaderElector("default", LEASE, "other", lease_duration_s=30)
    assert not other.try_acquire_or_renew()  # "me" has no host-pid form: waited out as before
    elector.release()
