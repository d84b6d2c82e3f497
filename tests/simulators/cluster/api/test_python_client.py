"""Conformance of the simulator's API as seen through the official Python client."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from simulators.cluster.server import SimulatorHandle

G, V, P = "jobset.x-k8s.io", "v1alpha2", "jobsets"


def jobset(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "JobSet",
        "metadata": {"name": name, **meta},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]}}}}}]},
    }


def pod(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}


def status_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


def patch_jobset(api_client: client.ApiClient, ns: str, name: str, body: Any, content_type: str) -> Any:
    """PATCH with an explicit media type (CustomObjectsApi in client 33 always sends merge patch)."""
    return api_client.call_api(
        f"/apis/{G}/{V}/namespaces/{{namespace}}/{P}/{{name}}", "PATCH",
        path_params={"namespace": ns, "name": name},
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body, response_type="object", _return_http_data_only=True,
    )


def test_it_round_trips_a_jobset_through_custom_objects_api(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    created = co.create_namespaced_custom_object(G, V, ns, P, {**jobset("ada"), "status": {"restarts": 5}})
    assert created["metadata"]["generation"] == 1 and "status" not in created
    got = co.get_namespaced_custom_object(G, V, ns, P, "ada")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]

    got["spec"]["suspend"] = True
    replaced = co.replace_namespaced_custom_object(G, V, ns, P, "ada", got)
    assert replaced["metadata"]["generation"] == 2
    assert int(replaced["metadata"]["resourceVersion"]) > int(got["metadata"]["resourceVersion"])

    with_status = co.patch_namespaced_custom_object_status(G, V, ns, P, "ada", {"status": {"restarts": 1}})
    assert with_status["status"] == {"restarts": 1} and with_status["metadata"]["generation"] == 2

    gone = co.delete_namespaced_custom_object(G, V, ns, P, "ada")
    assert gone["kind"] == "Status" and gone["status"] == "Success"
    assert gone["details"] == {"name": "ada", "group": G, "kind": P, "uid": created["metadata"]["uid"]}
    with pytest.raises(ApiException) as err:
        co.get_namespaced_custom_object(G, V, ns, P, "ada")
    assert err.value.status == 404
    assert status_of(err.value) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f'jobsets.{G} "ada" not found', "reason": "NotFound",
        "details": {"name": "ada", "group": G, "kind": P}, "code": 404,
    }


def test_it_answers_a_second_create_with_already_exists(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    co.create_namespaced_custom_object(G, V, ns, P, jobset("bea"))
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(G, V, ns, P, jobset("bea"))
    assert err.value.status == 409 and status_of(err.value)["reason"] == "AlreadyExists"


def test_it_refuses_a_stale_update_with_conflict(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    stale = co.create_namespaced_custom_object(G, V, ns, P, jobset("cy"))
    co.patch_namespaced_custom_object(G, V, ns, P, "cy", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as err:
        co.replace_namespaced_custom_object(G, V, ns, P, "cy", stale)
    body = status_of(err.value)
    assert err.value.status == 409 and body["reason"] == "Conflict"
    assert body["message"] == (
        f'Operation cannot be fulfilled on jobsets.{G} "cy": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    no_rv = dict(stale, metadata={k: v for k, v in stale["metadata"].items() if k != "resourceVersion"})
    with pytest.raises(ApiException) as err:
        co.replace_namespaced_custom_object(G, V, ns, P, "cy", no_rv)
    assert err.value.status == 422


def test_it_answers_a_failed_json_patch_test_with_422(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    created = co.create_namespaced_custom_object(G, V, ns, P, jobset("dee"))
    rv = created["metadata"]["resourceVersion"]
    ok = patch_jobset(
        api_client, ns, "dee",
        [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
         {"op": "add", "path": "/metadata/finalizers", "value": ["kopf.zalando.org/KopfFinalizerMarker"]}],
        "application/json-patch+json",
    )
    assert ok["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
    with pytest.raises(ApiException) as err:
        patch_jobset(api_client, ns, "dee", [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}],
                     "application/json-patch+json")
    assert err.value.status == 422
    assert status_of(err.value)["message"] == "the server rejected our request due to an error in our request"


def test_it_refuses_strategic_merge_patch_on_a_custom_resource(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    co.create_namespaced_custom_object(G, V, ns, P, jobset("eve"))
    with pytest.raises(ApiException) as err:
        patch_jobset(api_client, ns, "eve", {"spec": {"suspend": True}}, "application/strategic-merge-patch+json")
    assert err.value.status == 415 and status_of(err.value)["reason"] == "UnsupportedMediaType"


def test_it_merges_pod_containers_by_name_in_a_strategic_patch(api_client: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api_client)
    body = pod("fay")
    body["spec"]["containers"].append({"name": "side", "image": "busybox:1.36"})
    core.create_namespaced_pod(ns, body)
    patched = core.patch_namespaced_pod("fay", ns, {"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}})
    assert [(c.name, c.image) for c in patched.spec.containers] == [("main", "busybox:1.37"), ("side", "busybox:1.36")]
    status = core.patch_namespaced_pod_status("fay", ns, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}})
    assert status.status.phase == "Running"
    status = core.patch_namespaced_pod_status("fay", ns, {"status": {"conditions": [
        {"type": "PodScheduled", "status": "True"}]}})
    assert sorted(c.type for c in status.status.conditions) == ["PodScheduled", "Ready"]


def test_it_keeps_an_object_with_finalizers_until_they_are_removed(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    co.create_namespaced_custom_object(G, V, ns, P, jobset("gil", finalizers=["jobset.xmanager.cloud/finalizer"]))
    deleting = co.delete_namespaced_custom_object(G, V, ns, P, "gil")
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 0
    assert deleting["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as err:
        co.patch_namespaced_custom_object(G, V, ns, P, "gil", {"metadata": {"finalizers": ["x/new", "jobset.xmanager.cloud/finalizer"]}})
    assert err.value.status == 422
    last = co.patch_namespaced_custom_object(G, V, ns, P, "gil", {"metadata": {"finalizers": None}})
    assert "finalizers" not in last["metadata"]
    with pytest.raises(ApiException) as err:
        co.get_namespaced_custom_object(G, V, ns, P, "gil")
    assert err.value.status == 404


def test_it_checks_delete_preconditions(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    created = co.create_namespaced_custom_object(G, V, ns, P, jobset("hal"))
    with pytest.raises(ApiException) as err:
        co.delete_namespaced_custom_object(G, V, ns, P, "hal", body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="not-the-uid")))
    body = status_of(err.value)
    assert err.value.status == 409 and body["details"]["kind"] == "JobSet"
    assert "the UID in the precondition (not-the-uid) does not match the UID in record" in body["message"]
    co.delete_namespaced_custom_object(G, V, ns, P, "hal", body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=created["metadata"]["uid"])))


def test_it_garbage_collects_jobs_and_pods_by_owner_references(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    batch = client.BatchV1Api(api_client)
    core = client.CoreV1Api(api_client)
    owner = co.create_namespaced_custom_object(G, V, ns, P, jobset("ivy"))
    job = batch.create_namespaced_job(ns, {
        "metadata": {"name": "ivy-w-0", "ownerReferences": [{"apiVersion": f"{G}/{V}", "kind": "JobSet",
                     "name": "ivy", "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]}}},
    })
    assert job.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": job.metadata.uid}
    core.create_namespaced_pod(ns, pod("ivy-w-0-0", ownerReferences=[{
        "apiVersion": "batch/v1", "kind": "Job", "name": "ivy-w-0", "uid": job.metadata.uid,
        "controller": True, "blockOwnerDeletion": True}]))
    co.delete_namespaced_custom_object(G, V, ns, P, "ivy", propagation_policy="Foreground")
    assert batch.list_namespaced_job(ns).items == []
    assert core.list_namespaced_pod(ns).items == []


def test_it_lists_with_selectors_and_pages(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    for i in range(5):
        co.create_namespaced_custom_object(G, V, ns, P, jobset(f"js-{i}", labels={"team": "a" if i % 2 else "b"}))
    by_label = co.list_namespaced_custom_object(G, V, ns, P, label_selector="team in (a)")
    assert [o["metadata"]["name"] for o in by_label["items"]] == ["js-1", "js-3"]
    by_field = co.list_namespaced_custom_object(G, V, ns, P, field_selector="metadata.name=js-4")
    assert [o["metadata"]["name"] for o in by_field["items"]] == ["js-4"]
    names, token = [], None
    while True:
        page = co.list_namespaced_custom_object(G, V, ns, P, limit=2, _continue=token)
        names += [o["metadata"]["name"] for o in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    assert names == [f"js-{i}" for i in range(5)]
    with pytest.raises(ApiException) as err:
        co.list_namespaced_custom_object(G, V, ns, P, field_selector="spec.suspend=true")
    assert err.value.status == 400 and "field label not supported: spec.suspend" in status_of(err.value)["message"]


def test_it_selects_pods_by_phase_and_events_by_involved_object(api_client: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(ns, pod("run"))
    core.create_namespaced_pod(ns, pod("wait"))
    core.patch_namespaced_pod_status("run", ns, {"status": {"phase": "Running"}})
    running = core.list_namespaced_pod(ns, field_selector="status.phase=Running")
    assert [p.metadata.name for p in running.items] == ["run"]
    target = core.read_namespaced_pod("run", ns)
    core.create_namespaced_event(ns, {"metadata": {"generateName": "run."}, "involvedObject": {
        "kind": "Pod", "name": "run", "namespace": ns, "uid": target.metadata.uid}, "reason": "Started",
        "message": "Started container main", "type": "Normal"})
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.uid={target.metadata.uid},involvedObject.name=run")
    assert [e.reason for e in events.items] == ["Started"]


def test_it_streams_watch_events_from_a_resource_version(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    listed = co.list_namespaced_custom_object(G, V, ns, P)
    rv = listed["metadata"]["resourceVersion"]

    def writer() -> None:
        time.sleep(0.2)
        co.create_namespaced_custom_object(G, V, ns, P, jobset("kim"))
        co.patch_namespaced_custom_object(G, V, ns, P, "kim", {"spec": {"suspend": True}})
        co.delete_namespaced_custom_object(G, V, ns, P, "kim")

    threading.Thread(target=writer).start()
    seen = []
    w = watch.Watch()
    for event in w.stream(co.list_namespaced_custom_object, G, V, ns, P, resource_version=rv, timeout_seconds=3):
        seen.append((event["type"], event["object"]["metadata"]["name"]))
        if event["type"] == "DELETED":
            w.stop()
    assert seen == [("ADDED", "kim"), ("MODIFIED", "kim"), ("DELETED", "kim")]


def test_it_sends_bookmarks_when_asked(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    rv = co.list_namespaced_custom_object(G, V, ns, P)["metadata"]["resourceVersion"]
    w = watch.Watch()
    types = []
    for event in w.stream(co.list_namespaced_custom_object, G, V, ns, P, resource_version=rv,
                          allow_watch_bookmarks=True, timeout_seconds=3):
        types.append(event["type"])
        assert int(event["raw_object"]["metadata"]["resourceVersion"]) >= int(rv)
        w.stop()
    assert types == ["BOOKMARK"]


def test_it_expires_a_too_old_resource_version_with_410(api_simulator: SimulatorHandle, api_client: client.ApiClient,
                                                        ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    old_rv = co.create_namespaced_custom_object(G, V, ns, P, jobset("lou"))["metadata"]["resourceVersion"]
    co.patch_namespaced_custom_object(G, V, ns, P, "lou", {"spec": {"suspend": True}})
    api_simulator.store.compact()
    with pytest.raises(ApiException) as err:
        for _ in watch.Watch().stream(co.list_namespaced_custom_object, G, V, ns, P,
                                      resource_version=old_rv, timeout_seconds=2):
            pass
    assert err.value.status == 410 and err.value.reason.startswith("Expired: too old resource version")
    fresh = co.list_namespaced_custom_object(G, V, ns, P)["metadata"]["resourceVersion"]
    assert int(fresh) > int(old_rv)


def test_it_serves_leases_for_leader_election(api_client: client.ApiClient, ns: str) -> None:
    coord = client.CoordinationV1Api(api_client)
    lease = coord.create_namespaced_lease(ns, {"metadata": {"name": "reconciler"}, "spec": {
        "holderIdentity": "a", "leaseDurationSeconds": 15}})
    lease.spec.holder_identity = "b"
    renewed = coord.replace_namespaced_lease("reconciler", ns, lease)
    assert renewed.spec.holder_identity == "b"
    with pytest.raises(ApiException) as err:
        coord.replace_namespaced_lease("reconciler", ns, lease)
    assert err.value.status == 409


def test_it_serves_pod_logs(api_simulator: SimulatorHandle, api_client: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(ns, pod("mo"))
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("mo", ns, container="main")
    assert err.value.status == 400 and "is waiting to start" in status_of(err.value)["message"]
    api_simulator.pod_logs.append(ns, "mo", "main", "step 1\nstep 2\nstep 3")
    assert core.read_namespaced_pod_log("mo", ns, container="main") == "step 1\nstep 2\nstep 3\n"
    assert core.read_namespaced_pod_log("mo", ns, container="main", tail_lines=1) == "step 3\n"
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("mo", ns, container="nope")
    assert err.value.status == 400


def test_it_serves_pending_workloads_in_queue_order(api_client: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api_client)
    cq = f"cq-{ns}"
    co.create_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", {"metadata": {"name": cq}, "spec": {}})
    co.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns, "localqueues",
                                       {"metadata": {"name": "lq"}, "spec": {"clusterQueue": cq}})
    for name, prio in (("low", 0), ("high", 10)):
        co.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns, "workloads", {
            "metadata": {"name": name}, "spec": {"queueName": "lq", "priority": prio, "podSets": []}})
    summary = co.get_cluster_custom_object("visibility.kueue.x-k8s.io", "v1beta1", "clusterqueues",
                                           f"{cq}/pendingworkloads")
    assert summary["kind"] == "PendingWorkloadsSummary"
    assert [(i["metadata"]["name"], i["positionInClusterQueue"]) for i in summary["items"]] == [("high", 0), ("low", 1)]
    local = co.get_namespaced_custom_object("visibility.kueue.x-k8s.io", "v1beta1", ns, "localqueues",
                                            "lq/pendingworkloads")
    assert [i["positionInLocalQueue"] for i in local["items"]] == [0, 1]


def test_it_deletes_a_namespace_with_its_contents(api_client: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api_client)
    co = client.CustomObjectsApi(api_client)
    co.create_namespaced_custom_object(G, V, ns, P, jobset("nia"))
    terminating = core.delete_namespace(ns)
    assert terminating.kind == "Namespace"
    with pytest.raises(ApiException) as err:
        core.read_namespace(ns)
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(G, V, ns, P, jobset("nia"))
    assert err.value.status == 404


def test_it_streams_typed_pod_events_and_follows_logs(api_simulator: SimulatorHandle, api_client: client.ApiClient,
                                                      ns: str) -> None:
    core = client.CoreV1Api(api_client)
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    core.create_namespaced_pod(ns, pod("pia", labels={"app": "trainer"}))
    core.create_namespaced_pod(ns, pod("pia-side", labels={"app": "sidecar"}))
    seen = []
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_pod, ns, resource_version=rv, label_selector="app!=sidecar",
                          allow_watch_bookmarks=True, timeout_seconds=3):
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "ADDED":
            w.stop()
    assert seen == [("ADDED", "pia")]

    api_simulator.pod_logs.append(ns, "pia", "main", "first")

    def finish() -> None:
        time.sleep(0.5)
        api_simulator.pod_logs.append(ns, "pia", "main", "second")
        time.sleep(0.5)
        api_simulator.store.patch("pods", ns, "pia", "merge", {"status": {"phase": "Succeeded"}}, subresource="status")

    threading.Thread(target=finish).start()
    lines = list(watch.Watch().stream(core.read_namespaced_pod_log, "pia", ns, container="main", follow=True))
    assert lines == ["first", "second"]


def test_it_deletes_a_running_pod_gracefully(api_simulator: SimulatorHandle, api_client: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api_client)
    body = pod("quin")
    body["spec"]["nodeName"] = "sim-node-1"
    body["spec"]["terminationGracePeriodSeconds"] = 1
    core.create_namespaced_pod(ns, body)
    terminating = core.delete_namespaced_pod("quin", ns)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not core.list_namespaced_pod(ns, field_selector="metadata.name=quin").items:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the pod was not removed after its grace period")
    core.create_namespaced_pod(ns, body)
    gone = core.delete_namespaced_pod("quin", ns, grace_period_seconds=0)
    assert gone.metadata.name == "quin"
    assert core.list_namespaced_pod(ns).items == []


def test_it_deletes_a_collection_by_label_and_accepts_a_dummy_token(api_simulator: SimulatorHandle, ns: str) -> None:
    config = client.Configuration(host=api_simulator.url, api_key={"authorization": "dummy"}, api_key_prefix={"authorization": "Bearer"})
    with client.ApiClient(config) as api:
        co = client.CustomObjectsApi(api)
        for name, team in (("a", "x"), ("b", "x"), ("c", "y")):
            co.create_namespaced_custom_object(G, V, ns, P, jobset(name, labels={"team": team}))
        co.delete_collection_namespaced_custom_object(G, V, ns, P, label_selector="team=x")
        left = co.list_namespaced_custom_object(G, V, ns, P)["items"]
        assert [o["metadata"]["name"] for o in left] == ["c"]
