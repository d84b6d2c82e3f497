"""/v1/queues against the simulated Kueue: its quota, usage and counts as Kueue reports them, and the
pending workloads of its visibility API in Kueue's order, joined to experiments and owners.

The simulator runs with controllers (real HTTP, the real ``kubernetes`` client of
``k8s_bridge.client``); JobSets are shaped as the actuator builds them
(`tests.fixtures.simulators.Cluster`), so the workloads Kueue makes are owned by
``xmc-<xid>-<wid>``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from k8s_bridge import client
from tests import factories
from tests.fixtures.simulators import Cluster
from tests.k8s_bridge.reconciler.test_end_to_end import small_queue
from tests.waiting import eventually
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db
ALICE, BOB = factories.ALICE, factories.BOB


def get(email: str, url: str, **params: str) -> Any:
    return Client(HTTP_AUTHORIZATION=f"Bearer {issue_token(email)}").get(url, params)


def kueue(plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """The object as Kueue keeps it (its own numbers)."""
    api = client.custom_objects()
    if namespace:
        return dict(api.get_namespaced_custom_object(client.KUEUE_GROUP, client.KUEUE_VERSION, namespace, plural, name))
    return dict(api.get_cluster_custom_object(client.KUEUE_GROUP, client.KUEUE_VERSION, plural, name))


@pytest.fixture
def busy(make_cluster: Callable[..., Cluster]) -> dict[str, Any]:
    """Two CPUs of quota: Alice's first two units run, her next two and Bob's one wait."""
    cluster = make_cluster(clusterQueues=small_queue("2"))
    alice, bob = factories.experiment(ALICE, title="resnet sweep"), factories.experiment(BOB, title="bob's")
    a = [factories.work_unit(alice) for _ in range(4)]
    b = factories.work_unit(bob)
    for unit in a[:2]:
        cluster.create_jobset(unit, script="pull=0s;run=forever")
    eventually(lambda: kueue("clusterqueues", "cluster-queue").get("status", {}).get("admittedWorkloads") == 2,
               what="two admitted")
    for unit in (a[2], b, a[3]):
        cluster.create_jobset(unit, script="pull=0s;run=forever")
        eventually(lambda u=unit: any(
            ref["name"] == f"xmc-{u.experiment_id}-{u.wid}" for item in client.get_json(
                client.VISIBILITY_PATH, {"cq": "cluster-queue"})["items"]
            for ref in item["metadata"]["ownerReferences"]), what="pending in order")
    eventually(lambda: kueue("clusterqueues", "cluster-queue")["status"].get("pendingWorkloads") == 3,
               what="three pending")
    eventually(lambda: kueue("localqueues", "cpu-queue", "default")["status"].get("pendingWorkloads") == 3,
               what="the LocalQueue's status")
    return {"alice": alice, "bob": bob, "a": a, "b": b}


def test_it_shows_kueues_quota_usage_and_counts_for_the_queues(busy: dict[str, Any]) -> None:
    response = get(ALICE, "/v1/queues")
    assert response.status_code == 200
    (cq,) = [q for q in response.json()["clusterQueues"] if q["name"] == "cluster-queue"]
    own = kueue("clusterqueues", "cluster-queue")
    assert (cq["pendingWorkloads"], cq["reservingWorkloads"], cq["admittedWorkloads"]) == (
        own["status"]["pendingWorkloads"], own["status"]["reservingWorkloads"], own["status"]["admittedWorkloads"])
    assert (cq["pendingWorkloads"], cq["admittedWorkloads"]) == (3, 2)
    cpu = next(r for r in cq["resources"] if r["resource"] == "cpu")
    reported = {r["name"]: r for r in own["status"]["flavorsReservation"][0]["resources"]}
    assert (cpu["flavor"], cpu["nominalQuota"], cpu["usage"], cpu["borrowed"]) == (
        "default-flavor", "2", reported["cpu"]["total"], reported["cpu"]["borrowed"])
    assert cpu["usage"] == "2" and cpu["borrowed"] == "0"
    lq = next(q for q in cq["localQueues"] if q["name"] == "cpu-queue")
    own_lq = kueue("localqueues", "cpu-queue", "default")["status"]
    assert (lq["pendingWorkloads"], lq["admittedWorkloads"]) == (own_lq["pendingWorkloads"], own_lq["admittedWorkloads"])
    assert {"flavor": "default-flavor", "resource": "cpu", "total": "2"} in lq["usage"]


def test_it_lists_pending_workloads_in_kueues_order_joined_to_what_the_caller_may_read(busy: dict[str, Any]) -> None:
    a, b = busy["a"], busy["b"]
    raw = client.get_json(client.VISIBILITY_PATH, {"cq": "cluster-queue"})
    assert raw["kind"] == "PendingWorkloadsSummary" and raw["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"

    body = get(ALICE, "/v1/queues/cluster-queue/pendingWorkloads").json()
    items = body["pendingWorkloads"]
    assert [i["name"] for i in items] == [i["metadata"]["name"] for i in raw["items"]]
    assert [(i["positionInClusterQueue"], i["positionInLocalQueue"], i["localQueue"]) for i in items] == [
        (0, 0, "cpu-queue"), (1, 1, "cpu-queue"), (2, 2, "cpu-queue")]
    first, bobs, last = items
    assert first["workUnit"] == f"experiments/{a[2].experiment_id}/workUnits/{a[2].wid}"
    assert first["execution"].endswith("/executions/1") and first["owner"] == ALICE
    assert first["title"] == "resnet sweep"
    assert last["workUnit"] == f"experiments/{a[3].experiment_id}/workUnits/{a[3].wid}"
    assert "workUnit" not in bobs and "owner" not in bobs          # Bob's experiment: not Alice's to read
    assert first["estimatedStart"] == "unknown"                    # no admissions recorded in XMC's history

    theirs = get(BOB, "/v1/queues/cluster-queue/pendingWorkloads").json()["pendingWorkloads"]
    assert theirs[1]["workUnit"] == f"experiments/{b.experiment_id}/workUnits/{b.wid}" and "owner" not in theirs[0]


def test_it_pages_and_filters_pending_workloads_by_local_queue(busy: dict[str, Any]) -> None:
    page = get(ALICE, "/v1/queues/cluster-queue/pendingWorkloads", pageSize="2").json()
    assert [i["positionInClusterQueue"] for i in page["pendingWorkloads"]] == [0, 1] and page["nextPageToken"] == "2"
    rest = get(ALICE, "/v1/queues/cluster-queue/pendingWorkloads", pageSize="2", pageToken="2").json()
    assert [i["positionInClusterQueue"] for i in rest["pendingWorkloads"]] == [2] and rest["nextPageToken"] == ""
    local = get(ALICE, "/v1/queues/cluster-queue/pendingWorkloads", localQueue="default/cpu-queue").json()
    assert len(local["pendingWorkloads"]) == 3
    assert get(ALICE, "/v1/queues/cluster-queue/pendingWorkloads", localQueue="default/gpu-queue").json()[
        "pendingWorkloads"] == []


@pytest.mark.parametrize(("url", "params", "status", "field"), [
    ("/v1/queues", {"all": "1"}, 400, "all"),
    ("/v1/queues/cluster-queue/pendingWorkloads", {"pageSize": "0"}, 400, "pageSize"),
    ("/v1/queues/cluster-queue/pendingWorkloads", {"pageSize": "lots"}, 400, "pageSize"),
    ("/v1/queues/cluster-queue/pendingWorkloads", {"pageToken": "-3"}, 400, "pageToken"),
    ("/v1/queues/cluster-queue/pendingWorkloads", {"localQueue": "cpu-queue"}, 400, "localQueue"),
    ("/v1/queues/cluster-queue/pendingWorkloads", {"order": "asc"}, 400, "order"),
    ("/v1/queues/Not_A_Queue/pendingWorkloads", {}, 400, "clusterQueue"),
    ("/v1/queues/no-such-queue/pendingWorkloads", {}, 404, "name"),
])
def test_it_refuses_bad_input_naming_the_field(make_cluster: Callable[..., Cluster], url: str,
                                               params: dict[str, str], status: int, field: str) -> None:
    make_cluster()
    response = get(ALICE, url, **params)
    assert response.status_code == status, response.content
    assert response.json()["error"]["details"][0]["fieldViolations"][0]["field"] == field



def test_it_answers_unavailable_not_an_internal_error_when_the_cluster_cannot_be_reached(settings: Any, tmp_path: Any) -> None:
    settings.KUBECONFIG = str(tmp_path / "no-such-kubeconfig")
    client.reset()
    try:
        for url in ("/v1/queues", "/v1/queues/cluster-queue/pendingWorkloads"):
            response = get(ALICE, url)
            assert response.status_code == 503, (url, response.content)
            assert response.json()["error"]["status"] == "UNAVAILABLE"
    finally:
        client.reset()
