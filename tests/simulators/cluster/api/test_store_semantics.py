"""The simulator store, called in-process the way the simulated controllers call it."""

from __future__ import annotations

import threading

import pytest

from simulators.cluster.resources import by_plural
from simulators.cluster.store import ApiError, Store

JOBSETS = by_plural("jobsets")
PODS = by_plural("pods")
JOBS = by_plural("jobs")


def jobset(name: str, **meta: object) -> dict:
    return {"metadata": {"name": name, **meta}, "spec": {"replicatedJobs": []}}


def pod(name: str, **meta: object) -> dict:
    return {"metadata": {"name": name, **meta}, "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}


def test_it_stamps_identity_and_drops_status_on_create() -> None:
    store = Store()
    created = store.create(JOBSETS, "default", {**jobset("ada"), "status": {"restarts": 3}})
    assert created["metadata"]["generation"] == 1
    assert created["metadata"]["uid"]
    assert int(created["metadata"]["resourceVersion"]) == store.resource_version
    assert "status" not in created
    with pytest.raises(ApiError) as err:
        store.create(JOBSETS, "default", jobset("ada"))
    assert err.value.code == 409 and err.value.reason == "AlreadyExists"


def test_it_names_objects_from_generate_name() -> None:
    store = Store()
    created = store.create(PODS, "default", pod("", generateName="worker-"))
    assert created["metadata"]["name"].startswith("worker-") and len(created["metadata"]["name"]) == 12


def test_it_bumps_generation_only_for_spec_changes() -> None:
    store = Store()
    store.create(JOBSETS, "default", jobset("bea"))
    labelled = store.patch(JOBSETS, "default", "bea", "merge", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    status = store.patch(JOBSETS, "default", "bea", "merge", {"status": {"restarts": 1}}, subresource="status")
    assert status["metadata"]["generation"] == 1 and status["status"] == {"restarts": 1}
    ignored = store.patch(JOBSETS, "default", "bea", "merge", {"status": {"restarts": 9}})
    assert ignored["status"] == {"restarts": 1}
    assert ignored["metadata"]["resourceVersion"] == status["metadata"]["resourceVersion"]
    spec = store.patch(JOBSETS, "default", "bea", "merge", {"spec": {"suspend": True}})
    assert spec["metadata"]["generation"] == 2


def test_it_rejects_stale_updates_with_conflict() -> None:
    store = Store()
    old = store.create(JOBSETS, "default", jobset("cy"))
    store.patch(JOBSETS, "default", "cy", "merge", {"spec": {"suspend": True}})
    with pytest.raises(ApiError) as err:
        store.update(JOBSETS, "default", "cy", old)
    assert err.value.code == 409 and err.value.reason == "Conflict"
    assert "the object has been modified" in err.value.message


def test_it_keeps_finalized_objects_until_the_last_finalizer_goes() -> None:
    store = Store()
    store.create(JOBSETS, "default", jobset("dee", finalizers=["x/y"]))
    deleting = store.delete(JOBSETS, "default", "dee")
    assert deleting["metadata"]["deletionTimestamp"] and deleting["metadata"]["generation"] == 2
    store.patch(JOBSETS, "default", "dee", "json", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(ApiError) as err:
        store.get(JOBSETS, "default", "dee")
    assert err.value.code == 404


def test_it_garbage_collects_dependents_in_background_and_orphans_on_request() -> None:
    store = Store()
    owner = store.create(JOBSETS, "default", jobset("eve"))
    ref = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "eve",
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    store.create(PODS, "default", pod("eve-0", ownerReferences=[ref]))
    store.delete(JOBSETS, "default", "eve")
    assert store.list(PODS, "default")[0] == []

    owner = store.create(JOBSETS, "default", jobset("eve"))
    store.create(PODS, "default", pod("eve-1", ownerReferences=[dict(ref, uid=owner["metadata"]["uid"])]))
    store.delete(JOBSETS, "default", "eve", propagation_policy="Orphan")
    (orphan,), _ = store.list(PODS, "default")
    assert "ownerReferences" not in orphan["metadata"]


def test_it_waits_for_blocking_dependents_in_foreground_deletion() -> None:
    store = Store()
    owner = store.create(JOBS, "default", {"metadata": {"name": "job"}, "spec": {"template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]}}}})
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "job", "uid": owner["metadata"]["uid"],
           "controller": True, "blockOwnerDeletion": True}
    store.create(PODS, "default", pod("job-0", ownerReferences=[ref], finalizers=["batch.kubernetes.io/job-tracking"]))
    store.delete(JOBS, "default", "job", propagation_policy="Foreground")
    assert "foregroundDeletion" in store.get(JOBS, "default", "job")["metadata"]["finalizers"]
    assert store.get(PODS, "default", "job-0")["metadata"]["deletionTimestamp"]
    store.patch(PODS, "default", "job-0", "merge", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiError):
        store.get(JOBS, "default", "job")


def test_it_delivers_watch_events_after_a_resource_version_and_expires_old_ones() -> None:
    store = Store()
    start = store.create(JOBSETS, "default", jobset("fay"))["metadata"]["resourceVersion"]
    store.patch(JOBSETS, "default", "fay", "merge", {"spec": {"suspend": True}})
    events = list(store.watch(JOBSETS, "default", resource_version=start, timeout_s=0.2))
    assert [e["type"] for e in events] == ["MODIFIED"]
    store.compact()
    (error,) = list(store.watch(JOBSETS, "default", resource_version=start, timeout_s=0.2))
    assert error["type"] == "ERROR" and error["object"]["code"] == 410


def test_it_calls_listeners_after_commit() -> None:
    store = Store()
    seen: list[tuple[str, str]] = []
    store.add_listener(lambda etype, rt, obj: seen.append((etype, obj["metadata"]["name"])))
    store.create(JOBSETS, "default", jobset("gil"))
    store.delete(JOBSETS, "default", "gil")
    assert seen == [("ADDED", "gil"), ("DELETED", "gil")]


def test_it_survives_concurrent_writers_with_unique_resource_versions() -> None:
    store = Store()
    rvs: list[str] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        for j in range(50):
            obj = store.create(PODS, "default", pod(f"p-{i}-{j}"))
            with lock:
                rvs.append(obj["metadata"]["resourceVersion"])

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(rvs)) == 200


def test_it_round_trips_a_snapshot() -> None:
    store = Store()
    store.create(JOBSETS, "default", jobset("hal"))
    copy = Store()
    copy.restore(store.snapshot())
    assert copy.get(JOBSETS, "default", "hal") == store.get(JOBSETS, "default", "hal")
    assert copy.resource_version == store.resource_version


def test_it_expires_old_events_like_the_event_ttl() -> None:
    now = [1_000_000.0]
    store = Store(clock=lambda: now[0])
    involved = {"kind": "Pod", "name": "p", "namespace": "default"}
    store.create("events", "default", {"metadata": {"name": "p.1"}, "involvedObject": involved, "reason": "Old"})
    now[0] += 3000
    store.create("events", "default", {"metadata": {"name": "p.2"}, "involvedObject": involved, "reason": "New"})
    now[0] += 1000
    assert store.expire_events(3600) == 1
    assert [e["reason"] for e in store.list("events", "default")[0]] == ["New"]


def test_it_expires_continue_tokens_only_after_compaction() -> None:
    store = Store()
    for i in range(3):
        store.create(JOBSETS, "default", jobset(f"js-{i}"))
    _, _, token, remaining = store.list_page(JOBSETS, "default", limit=1)
    assert remaining == 2 and token
    items, _, _, _ = store.list_page(JOBSETS, "default", limit=1, continue_token=token)
    assert [o["metadata"]["name"] for o in items] == ["js-1"]
    store.create(JOBSETS, "default", jobset("js-3"))
    store.compact()
    with pytest.raises(ApiError) as err:
        store.list_page(JOBSETS, "default", limit=1, continue_token=token)
    assert err.value.code == 410


def test_it_checks_a_resource_version_precondition_on_delete() -> None:
    store = Store()
    created = store.create(JOBSETS, "default", jobset("ivy"))
    store.patch(JOBSETS, "default", "ivy", "merge", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiError) as err:
        store.delete(JOBSETS, "default", "ivy", preconditions={"resourceVersion": created["metadata"]["resourceVersion"]})
    assert err.value.code == 409 and "the ResourceVersion in the precondition" in err.value.message
    assert err.value.details == {"name": "ivy", "group": "jobset.x-k8s.io", "kind": "JobSet"}


def test_it_runs_admission_hooks_on_create_and_update() -> None:
    store = Store()

    def suspend_queued(op: str, rt: object, obj: dict, old: object) -> None:
        if op == "CREATE" and "kueue.x-k8s.io/queue-name" in (obj["metadata"].get("labels") or {}):
            obj["spec"]["suspend"] = True
        if op == "UPDATE" and obj["spec"].get("replicatedJobs") != (old or {})["spec"].get("replicatedJobs"):  # type: ignore[index]
            raise ApiError(422, "Invalid", "replicatedJobs is immutable")

    store.add_admission_hook(suspend_queued, ("jobsets",))
    created = store.create(JOBSETS, "default", jobset("jon", labels={"kueue.x-k8s.io/queue-name": "q"}))
    assert created["spec"]["suspend"] is True
    with pytest.raises(ApiError):
        store.patch(JOBSETS, "default", "jon", "merge", {"spec": {"replicatedJobs": [{"name": "x"}]}})


def test_it_emits_utc_timestamps_with_z_like_metav1_time() -> None:
    store = Store()
    created = store.create("events", "default", {
        "metadata": {"name": "e.1", "annotations": {"note": "2025-01-01T00:00:00+00:00"}},
        "involvedObject": {"kind": "Pod", "name": "p"},
        "firstTimestamp": "2025-01-01T00:00:00+00:00", "eventTime": "2025-01-01T00:00:00.123456+00:00",
    })
    assert created["firstTimestamp"] == "2025-01-01T00:00:00Z"
    assert created["eventTime"] == "2025-01-01T00:00:00.123456Z"
    assert created["metadata"]["annotations"]["note"] == "2025-01-01T00:00:00+00:00"
    store.create(JOBSETS, "default", jobset("kit"))
    status = store.patch(JOBSETS, "default", "kit", "merge", {"status": {"conditions": [
        {"type": "Completed", "status": "True", "lastTransitionTime": "2025-01-02T03:04:05+00:00"}]}},
        subresource="status")
    assert status["status"]["conditions"][0]["lastTransitionTime"] == "2025-01-02T03:04:05Z"
