"""Execution logs end to end: simulator pods, the reconciler's archiver, the REST endpoint.

``GET /v1/experiments/{xid}/workUnits/{wid}/executions/{eid}/logs`` is called
through Django's full URL/view stack (and, for ``follow``, over a real HTTP
server); the lines come from the simulator's ``pods/log`` through the
official client, or from the archive (a folder in ``tmp_path``) once the pods
are gone.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import urllib3
from django.test import Client
from django.utils import timezone

from k8s_bridge import client
from k8s_bridge.logs import archive as logarchive
from k8s_bridge.models import PodLogArchive
from k8s_bridge.reconciler.controller import Reconciler
from tests import factories
from tests.k8s_bridge.reconciler.conftest import Cluster, execution, state_of
from tests.waiting import eventually
from workunits.choices import WorkUnitState
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkUnitState


def url(wu: Any, eid: int | None = None, query: str = "") -> str:
    wu.refresh_from_db()
    base = f"/v1/experiments/{wu.experiment_id}/workUnits/{wu.wid}/executions/{eid or wu.current_eid}/logs"
    return f"{base}?{query}" if query else base


def get(path: str, email: str = factories.ALICE) -> Any:
    return Client().get(path, HTTP_AUTHORIZATION=f"Bearer {issue_token(email)}")


def body(response: Any) -> str:
    return b"".join(response.streaming_content).decode() if response.streaming else response.content.decode()


@pytest.fixture
def archive_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/archive"


@pytest.fixture
def logs_reconciler(make_reconciler: Callable[..., Reconciler], archive_url: str,
                    settings: Any) -> Callable[..., Reconciler]:
    settings.XMC_RATE_LIMIT_PER_S = 0
    settings.XMC_LOG_ARCHIVE_FINALIZER_WAIT_S = 30

    def make(**kw: Any) -> Reconciler:
        return make_reconciler(archiver=logarchive.Archiver(url=archive_url, max_bytes=kw.pop("max_bytes", 1 << 20)),
                               **kw)

    return make


def running(cluster: Cluster, script: str, **kw: Any) -> Any:
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script=script, **kw)
    eventually(lambda: state_of(wu) == S.RUNNING, what="RUNNING")
    return wu


def test_it_tails_text_and_ndjson_with_replica_and_container(cluster: Cluster, logs_reconciler) -> None:
    logs_reconciler()
    wu = running(cluster, "pull=0s;log=every:1s:step {n} loss {x};run=forever", replicas=2)
    eventually(lambda: "step 3 loss" in body(get(url(wu, query="replica=main-1"))), timeout=60, what="3 steps")
    tail = get(url(wu, query="tailLines=2&replica=main-1"))
    assert tail.status_code == 200 and tail["Content-Type"].startswith("text/plain")
    lines = body(tail).splitlines()
    assert len(lines) == 2 and all(ln.startswith("step ") and " loss " in ln for ln in lines)
    assert tail["X-XMC-Log-Source"] == "cluster" and tail["X-XMC-Log-Replica"] == "main-1"
    assert tail["X-XMC-Log-Replicas"] == "main-0,main-1" and tail["X-XMC-Log-Container"] == "main"
    assert tail["X-XMC-Log-Pod"].startswith(f"xmc-{wu.experiment_id}-{wu.wid}-main-1-")
    default = get(url(wu, query="tailLines=1"))
    assert default["X-XMC-Log-Replica"] == "main-0"  # the first replica when none is named
    nd = get(url(wu, query="format=ndjson&tailLines=3&container=main&replica=main-0"))
    assert nd["Content-Type"] == "application/x-ndjson"
    records = [json.loads(ln) for ln in body(nd).splitlines()]
    assert len(records) == 3
    assert {r["replica"] for r in records} == {"main-0"} and {r["container"] for r in records} == {"main"}
    assert all(r["timestamp"].endswith("Z") and r["source"] == "cluster" for r in records)
    stamped = body(get(url(wu, query="timestamps=true&tailLines=1"))).strip()
    assert stamped.split(" ", 1)[0].endswith("Z") and " step " in f" {stamped}"
    # sinceTime: lines at or after the second record's time
    since = records[1]["timestamp"]
    after = [json.loads(ln) for ln in body(get(url(wu, query=f"format=ndjson&sinceTime={since}"))).splitlines()]
    assert after and after[0]["timestamp"] >= since and records[0]["text"] not in [r["text"] for r in after[:1]]
    both = [json.loads(ln) for ln in body(get(url(wu, query="replica=all&format=ndjson&tailLines=2"))).splitlines()]
    assert {r["replica"] for r in both} == {"main-0", "main-1"}
    assert [r["timestamp"] for r in both] == sorted(r["timestamp"] for r in both)  # interleaved by time


def test_it_answers_400_naming_bad_parameters_and_404_for_unknown_names(cluster: Cluster, logs_reconciler) -> None:
    logs_reconciler()
    wu = running(cluster, "pull=0s;run=forever")
    for query, field in [("tailLines=-1", "tailLines"), ("tailLines=ten", "tailLines"), ("sinceTime=yesterday", "sinceTime"),
                         ("follow=maybe", "follow"), ("previous=2", "previous"), ("format=xml", "format"),
                         ("replica=Main_0", "replica"), ("container=a/b", "container"), ("colour=red", "colour"),
                         ("tailLines=1&tailLines=2", "tailLines"), ("follow=true&previous=true", "follow"),
                         ("replica=all&follow=true", "follow"), ("tailLines=99999999999999999999", "tailLines")]:
        response = get(url(wu, query=query))
        assert response.status_code == 400, (query, response.content)
        error = response.json()["error"]
        assert error["status"] == "INVALID_ARGUMENT" and field in error["message"], (query, error)
    missing = get(url(wu, query="replica=main-7"))
    assert missing.status_code == 404 and "main-7" in missing.json()["error"]["message"]
    assert "main-0" in missing.json()["error"]["message"]  # says which replicas exist
    wrong = get(url(wu, query="container=sidecar"))
    assert wrong.status_code == 404 and "sidecar" in wrong.json()["error"]["message"]


def test_it_gives_a_stranger_the_404_of_a_missing_execution(cluster: Cluster, logs_reconciler) -> None:
    logs_reconciler()
    wu = running(cluster, "pull=0s;run=forever")
    stranger = get(url(wu), email=factories.BOB)
    assert stranger.status_code == 404
    missing = get(url(wu, eid=99), email=factories.BOB)
    assert missing.status_code == 404
    name = f"experiments/{wu.experiment_id}/workUnits/{wu.wid}/executions/"
    assert stranger.json()["error"]["message"] == f"{name}{wu.current_eid} not found"
    assert get(url(wu, eid=99)).status_code == 404  # the owner: the execution really is missing
    assert Client().get(url(wu)).status_code == 401
    assert get(url(wu)).status_code == 200  # the owner reads it


def test_it_follows_by_sending_a_new_line_while_the_request_is_open(cluster: Cluster, logs_reconciler, live_server) -> None:
    logs_reconciler()
    wu = running(cluster, "pull=0s;log=every:1s:step {n};run=forever")
    eventually(lambda: "step 1" in body(get(url(wu))), timeout=60, what="a first step")
    http = urllib3.PoolManager()
    response = http.request("GET", f"{live_server.url}{url(wu, query='follow=true&tailLines=1')}",
                            headers={"Authorization": f"Bearer {issue_token(factories.ALICE)}"},
                            preload_content=False, timeout=urllib3.Timeout(connect=5, read=30))
    assert response.status == 200 and response.headers["X-XMC-Log-Source"] == "cluster"
    seen: list[tuple[float, str]] = []
    opened = time.monotonic()
    buffer = b""
    while len(seen) < 4:
        chunk = response.read1(4096)  # what has arrived, without waiting for more
        assert chunk, "the stream ended while the container still runs"
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        seen += [(time.monotonic() - opened, ln.decode()) for ln in lines]
    response.release_conn()
    steps = [int(text.split()[1]) for _, text in seen]
    assert steps == list(range(steps[0], steps[0] + 4))  # consecutive lines, as written
    assert seen[-1][0] > seen[0][0] + 0.1  # the later ones arrived while the request was open


def test_it_gives_the_restarted_containers_log_with_previous(cluster: Cluster, logs_reconciler) -> None:
    logs_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;crash=every:3s;exit=3;log=every:1s:attempt {attempt} step {n}",
                          restart_policy="OnFailure", backoff_limit=6)

    def restarted() -> bool:
        response = get(url(wu, query="previous=true"))
        return response.status_code == 200 and "exiting with code 3" in body(response)

    eventually(restarted, timeout=60, what="a restarted container with a previous log")

    def one_attempt() -> tuple[list[str], list[str]] | None:
        """The previous and the current log, read while the same container ran (it restarts every 3 s: a
        loaded machine's reads can straddle a restart, and then they are read again)."""
        before = body(get(url(wu))).splitlines()
        previous = body(get(url(wu, query="previous=true"))).splitlines()
        after = body(get(url(wu))).splitlines()
        return (previous, after) if before[:1] == after[:1] else None

    previous, current = eventually(one_attempt, timeout=60, what="both logs read within one attempt")
    assert previous[0].startswith("[sim] main: started") and previous[-1] == "[sim] main: exiting with code 3"
    prev_attempt = int(previous[0].rsplit("attempt=", 1)[1])
    assert current[0].endswith(f"attempt={prev_attempt + 1}")


def test_it_serves_a_deleted_pods_log_from_the_archive_and_explains_the_failure(
        cluster: Cluster, logs_reconciler) -> None:
    rec = logs_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;log=every:1s:step {n};run=3s;exit=2;stderr=ValueError: bad batch",
                          backoff_limit=0)
    eventually(lambda: state_of(wu) == S.FAILED, timeout=60, what="FAILED")
    row = eventually(lambda: PodLogArchive.objects.filter(xid=wu.experiment_id, wid=wu.wid,
                                                          status=PodLogArchive.Status.ARCHIVED).first(),
                     timeout=30, what="the archived log")
    assert row.exit_code == 2 and row.replica == "main-0" and "ValueError: bad batch" in row.tail
    message = eventually(lambda: (m := execution(wu).system_message) and "auxiliaryInfo" in m and m,
                         timeout=30, what="the failure message with its last lines")
    text = message["userFacingText"]
    assert "replica main-0" in text and "container main exited with code 2" in text, text
    assert "BackoffLimitExceeded" in text and "FailedJobs" in text, text
    assert message["auxiliaryInfo"]["stackTrace"].splitlines()[-2:] == ["ValueError: bad batch",
                                                                      "[sim] main: exiting with code 2"]
    live = get(url(wu))
    assert live["X-XMC-Log-Source"] == "cluster"
    # The JobSet goes (finalizer path), its pods with it: the log is now served from the archive.
    cluster.delete_jobset(wu)
    eventually(lambda: cluster.jobset(wu) is None, timeout=60, what="the JobSet gone")
    eventually(lambda: not client.core().list_namespaced_pod(
        "default", label_selector=f"jobset.sigs.k8s.io/jobset-name=xmc-{wu.experiment_id}-{wu.wid}").items,
        timeout=60, what="the pods gone")
    archived = get(url(wu))
    assert archived.status_code == 200 and archived["X-XMC-Log-Source"] == "archive"
    assert archived["X-XMC-Log-Archived-At"] and "archived" in archived["X-XMC-Log-Note"]
    text_lines = body(archived).splitlines()
    assert text_lines == body(live).splitlines()  # the same log as the pod gave
    assert body(get(url(wu, query="tailLines=1"))) == "[sim] main: exiting with code 2\n"
    assert PodLogArchive.objects.filter(xid=wu.experiment_id, wid=wu.wid).count() == 1
    assert rec.archiver is not None and rec.archiver.writes == 1


def test_it_does_not_write_the_archive_twice_when_the_reconciler_restarts(
        cluster: Cluster, logs_reconciler, archive_url: str) -> None:
    first = logs_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=2s;exit=1", backoff_limit=0)
    row = eventually(lambda: PodLogArchive.objects.filter(xid=wu.experiment_id, wid=wu.wid,
                                                          status=PodLogArchive.Status.ARCHIVED).first(),
                     timeout=60, what="archived once")
    path = archive_url.removeprefix("file://")
    stat = os.stat(row.url.removeprefix("file://"))
    assert first.archiver is not None and first.archiver.writes == 1
    first.stop(drain=True)
    second = logs_reconciler()
    assert second.archiver is not None
    # The new reconciler sees the terminated pod again and asks for its archive: the row says it is done.
    eventually(lambda: second.archiver.settled([row.pod_uid]) and second.archiver.tails(row.pod_uid),
               timeout=30, what="the second archiver looked at it")
    assert second.archiver.writes == 0
    again = PodLogArchive.objects.get(pk=row.pk)
    assert again.archived_at == row.archived_at and again.attempts == row.attempts
    assert os.stat(row.url.removeprefix("file://")).st_mtime_ns == stat.st_mtime_ns
    assert path in row.url


def test_it_never_blocks_a_state_write_on_an_archive_store_failing_for_a_while(
        cluster: Cluster, logs_reconciler, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = threading.Event()
    broken.set()
    real_write = logarchive.write_object
    tries: list[float] = []

    def flaky(url: str, inst: Any, data: bytes) -> str:
        tries.append(time.monotonic())
        if broken.is_set():
            raise OSError("archive store unavailable (test)")
        return real_write(url, inst, data)

    monkeypatch.setattr(logarchive, "write_object", flaky)
    monkeypatch.setattr(logarchive, "BACKOFF_CAP_S", 0.5)
    logs_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;run=2s;exit=4", backoff_limit=0)
    # Every state arrives while the store refuses every write.
    eventually(lambda: state_of(wu) == S.FAILED, timeout=60, what="FAILED while the archive store is down")
    eventually(lambda: len(tries) >= 3, timeout=30, what="retries")
    row = PodLogArchive.objects.get(xid=wu.experiment_id, wid=wu.wid)
    assert row.status == PodLogArchive.Status.PENDING and row.attempts >= 2 and "unavailable" in row.last_error
    assert "exited with code 4" in execution(wu).system_message["userFacingText"]
    # A stop goes through too: the finalizer writes the state first, waits a bounded time for the logs.
    other = running(cluster, "pull=0s;run=forever")
    cluster.delete_jobset(other)
    eventually(lambda: state_of(other) == S.STOPPED, timeout=30, what="STOPPED while the store is down")
    broken.clear()
    eventually(lambda: PodLogArchive.objects.get(pk=row.pk).status == PodLogArchive.Status.ARCHIVED,
               timeout=30, what="archived once the store is back")
    eventually(lambda: "auxiliaryInfo" in (execution(wu).system_message or {}), timeout=30,
               what="the failure message gains its last lines")
    eventually(lambda: cluster.jobset(other) is None, timeout=60, what="the stopped JobSet let go")



def test_it_keeps_the_last_bytes_and_the_console_link_in_the_archive(cluster: Cluster, logs_reconciler,
                                                               settings: Any) -> None:
    settings.XMC_LOGS_CONSOLE_URL_TEMPLATE = "https://logs.example/q?ns={namespace}&pod={pod}&c={container}&x={xid}-{wid}-{eid}"
    logs_reconciler(max_bytes=300)
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=0s;log=every:100ms:line {n} of a chatty job;run=3s;exit=0")
    eventually(lambda: state_of(wu) == S.COMPLETED, timeout=60, what="COMPLETED")
    live = get(url(wu))
    pod = live["X-XMC-Log-Pod"]
    assert live["X-XMC-Logs-Console-URL"] == (
        f"https://logs.example/q?ns=default&pod={pod}&c=main&x={wu.experiment_id}-{wu.wid}-{wu.current_eid}")
    full = body(live).splitlines()
    row = eventually(lambda: PodLogArchive.objects.filter(xid=wu.experiment_id, wid=wu.wid,
                                                          status=PodLogArchive.Status.ARCHIVED).first(),
                     timeout=30, what="archived")
    assert row.truncated and row.bytes <= 300
    cluster.delete_jobset(wu)
    eventually(lambda: cluster.jobset(wu) is None, timeout=60, what="the JobSet gone")
    eventually(lambda: get(url(wu))["X-XMC-Log-Source"] == "archive", timeout=60, what="served from the archive")
    archived = get(url(wu))
    assert archived["X-XMC-Log-Truncated"] == "true" and archived["X-XMC-Logs-Console-URL"].startswith("https://logs.")
    kept = body(archived).splitlines()
    assert 0 < len(kept) < len(full) and kept == full[-len(kept):]  # the last whole lines
    assert kept[-1] == "[sim] main: exiting with code 0"


def test_it_tells_which_container_instances_can_be_archived() -> None:
    def pod(**cs: Any) -> dict[str, Any]:
        return {"metadata": {"name": "p", "uid": "u1", "namespace": "ns",
                             "labels": {"jobset.sigs.k8s.io/replicatedjob-name": "w", "jobset.sigs.k8s.io/job-index": "2"}},
                "spec": {"containers": [{"name": "main"}]},
                "status": {"containerStatuses": [{"name": "main", **cs}]}}

    done = {"terminated": {"exitCode": 1, "reason": "Error"}}
    keys = lambda p, **kw: [(i.attempt, i.previous, i.finished, i.exit_code) for i in  # noqa: E731
                            logarchive.instances(1, 2, 3, p, **kw)]
    assert keys(pod(restartCount=0, state=done)) == [(0, False, True, 1)]
    assert keys(pod(restartCount=0, state={"running": {}})) == []
    assert keys(pod(restartCount=0, state={"running": {}}), snapshot=True) == [(0, False, False, None)]
    # Crash-looping: the last instance is still restartCount; once the next runs, restartCount - 1 (previous).
    assert keys(pod(restartCount=2, state={"waiting": {"reason": "CrashLoopBackOff"}}, lastState=done)) == [(2, False, True, 1)]
    assert keys(pod(restartCount=3, state={"running": {}}, lastState=done)) == [(2, True, True, 1)]
    assert keys(pod(restartCount=3, state={"running": {}}, lastState=done), snapshot=True) == [
        (2, True, True, 1), (3, False, False, None)]
    [inst] = logarchive.instances(1, 2, 3, pod(restartCount=0, state=done))
    assert inst.replica == "w-2" and inst.key == ("u1", "main", 0)


def test_it_keeps_only_the_last_whole_lines_within_the_limit() -> None:
    from k8s_bridge.logs.pods import RawLine

    lines = [RawLine(f"2026-01-01T00:00:{i:02d}Z", f"line {i}") for i in range(50)]
    data, cut, tail = logarchive.last_bytes(iter(lines), 100)
    kept = data.decode().splitlines()
    assert cut and len(data) <= 100 and kept[-1] == "2026-01-01T00:00:49Z line 49"
    assert all(k.split(" ", 1)[1] == f"line {i}" for k, i in zip(kept, range(50 - len(kept), 50)))
    assert tail == [f"line {i}" for i in range(30, 50)]
    whole, cut, _ = logarchive.last_bytes(iter(lines[:2]), 1000)
    assert not cut and whole.decode().count("\n") == 2


def test_it_follows_a_bounded_number_of_logs_in_a_web_process(cluster: Cluster, logs_reconciler, settings: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from k8s_bridge.logs import slots

    settings.XMC_LOGS_MAX_FOLLOWS = 1
    slots.reset()
    logs_reconciler()
    wu = running(cluster, "pull=0s;log=every:1s:step {n};run=forever")
    first = get(url(wu, query="follow=true"))
    assert first.status_code == 200 and first.streaming
    second = get(url(wu, query="follow=true"))
    assert second.status_code == 429 and second.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert get(url(wu, query="tailLines=1")).status_code == 200  # reading without follow is not limited
    first.close()  # the client went away: its slot is free again
    third = get(url(wu, query="follow=true"))
    assert third.status_code == 200
    third.close()


def test_it_answers_503_for_a_cluster_out_of_reach_and_says_why_a_pod_is_not_started(cluster: Cluster, logs_reconciler,
                                                                      settings: Any, tmp_path: Path) -> None:
    logs_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=fail:ImagePullBackOff")

    def waiting() -> Any:
        response = get(url(wu))
        return response if response.status_code == 200 and response.get("X-XMC-Log-Note") else None

    pulling = eventually(waiting, timeout=60, what="a pod waiting on its image")
    assert body(pulling) == "" and "waiting to start" in pulling["X-XMC-Log-Note"], pulling.get("X-XMC-Log-Note")
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: d\nclusters: [{name: d, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: d, context: {cluster: d, user: d}}]\nusers: [{name: d, user: {}}]\n")
    settings.KUBECONFIG = str(dead)
    client.reset()
    unreachable = get(url(wu))
    assert unreachable.status_code == 503 and unreachable.json()["error"]["status"] == "UNAVAILABLE"


def test_it_lets_the_archive_win_when_the_pod_cannot_serve_the_executions_log(
        cluster: Cluster, logs_reconciler, archive_url: str) -> None:
    # As after a restart of the simulator: the execution's pod is there again but its container has
    # not started in this cluster life ("waiting to start"), and its log was archived before.
    logs_reconciler()
    wu = factories.work_unit(factories.experiment())
    cluster.create_jobset(wu, script="pull=fail:ImagePullBackOff")

    def waiting() -> Any:
        response = get(url(wu))
        return response if response.status_code == 200 and response.get("X-XMC-Log-Note") else None

    assert "waiting to start" in eventually(waiting, timeout=60, what="a pod waiting to start")["X-XMC-Log-Note"]
    wu.refresh_from_db()
    inst = logarchive.Instance(wu.experiment_id, wu.wid, wu.current_eid, "default", "xmc-restored-main-0", "uid-0",
                               "main", 0, "main-0", previous=False, finished=True, exit_code=0, reason="Completed")
    written = logarchive.write_object(archive_url, inst, b"2026-12-01T10:00:00.000000Z step 1\n"
                                                         b"2026-12-01T10:00:01.000000Z the last line\n")
    PodLogArchive.objects.create(xid=inst.xid, wid=inst.wid, eid=inst.eid, namespace="default",
                                 pod_name=inst.pod_name, pod_uid=inst.pod_uid, container="main", replica="main-0",
                                 status=PodLogArchive.Status.ARCHIVED, url=written, archived_at=timezone.now())
    served = get(url(wu))
    assert served.status_code == 200 and served["X-XMC-Log-Source"] == "archive"
    assert body(served) == "step 1\nthe last line\n"
