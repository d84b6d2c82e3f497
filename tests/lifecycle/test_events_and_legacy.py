"""The reconciler-side hooks: events only for committed matching transitions, force-notify once;
with the flag off no events at all and the legacy inline sync keeps the run in step."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from artifacts import xprof
from artifacts.models import Artifact
from lifecycle import events, hooks
from lifecycle.hooks import JobSetContext
from simulators.mlrun import EmulatorHandle
from tests.lifecycle import brokers
from tests.lifecycle.conftest import CLUSTER, LOCATION, PROJECT, execution, running_work_unit, set_state, \
    xprof_artifact
from artifacts.wire import artifact_to_proto
from core import convert
from workunits.models import WorkUnit

pytestmark = pytest.mark.django_db
ALL = "STARTING.RUNNING.STOPPED.COMPLETED.FAILED"
CREATED = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def context(wu: WorkUnit, notify_when: str = ALL, *, uid: str = "uid-a", eid: int | None = None) -> JobSetContext:
    wu.refresh_from_db()
    return JobSetContext(xid=wu.experiment_id, wid=wu.wid, eid=eid or wu.current_eid, namespace="default",
                         name=f"xmc-{wu.experiment_id}-{wu.wid}", uid=uid, creation_time=CREATED,
                         notify_when=notify_when)


def published() -> list[events.LifecycleEvent]:
    sent = brokers.drain("lifecycle")
    assert all(name == events.TASK_NAME for name, _ in sent)
    return [events.decode(args[0]) for _, args in sent]


@pytest.fixture(autouse=True)
def _clean_queue() -> None:
    brokers.purge("lifecycle")


def test_it_publishes_only_committed_transitions_the_notify_when_names(lifecycle_on: Any) -> None:
    wu = running_work_unit()
    ctx = {(wu.experiment_id, wu.wid, 1): context(wu)}
    hooks.on_transitions_committed(set_state(wu, "SCHEDULING"), ctx)
    assert published() == []  # SCHEDULING is not wanted
    hooks.on_transitions_committed(set_state(wu, "RUNNING"), ctx)
    sent = published()
    assert len(sent) == 1
    event = sent[0]
    assert (event.xid, event.wid, event.eid) == (wu.experiment_id, wu.wid, 1)
    assert (event.old_state, event.new_state, event.force_notify) == ("SCHEDULING", "RUNNING", False)
    assert event.runtime == events.Runtime(CLUSTER, "default", f"xmc-{wu.experiment_id}-{wu.wid}", "uid-a",
                                           convert.ns_from_datetime(CREATED))
    assert set_state(wu, "RUNNING") == []  # refused/no-op writes commit no transition: nothing to publish
    hooks.on_transitions_committed([], ctx)
    assert published() == []


def test_it_publishes_nothing_for_a_jobset_without_notify_when(lifecycle_on: Any) -> None:
    wu = running_work_unit()
    hooks.on_transitions_committed(set_state(wu, "RUNNING"), {(wu.experiment_id, wu.wid, 1): context(wu, "")})
    assert published() == []


def test_it_force_notifies_once_when_notify_when_is_newly_added(lifecycle_on: Any) -> None:
    wu = running_work_unit()
    set_state(wu, "RUNNING")
    hooks.on_jobset_observed(context(wu, ""), "RUNNING")
    assert published() == []
    hooks.on_jobset_observed(context(wu), "RUNNING")  # the Update task patched the annotation
    sent = published()
    assert len(sent) == 1 and sent[0].force_notify and sent[0].new_state == "RUNNING"
    hooks.on_jobset_observed(context(wu), "RUNNING")
    assert published() == []  # once
    # A new JobSet object (another uid) for the same execution is tracked afresh.
    hooks.on_jobset_observed(context(wu, uid="uid-b"), "RUNNING")
    assert len(published()) == 1


def test_it_force_notifies_with_the_committed_state_of_the_current_execution_only(lifecycle_on: Any) -> None:
    wu = running_work_unit()
    set_state(wu, "SCHEDULING")
    hooks.on_jobset_observed(context(wu), "RUNNING")  # observed RUNNING, committed SCHEDULING (not wanted)
    assert published() == []
    hooks.on_jobset_observed(context(wu, uid="old", eid=7), "RUNNING")  # not the current execution
    assert published() == []


def test_it_publishes_no_events_with_the_flag_off_and_the_legacy_sync_keeps_the_run_in_step(
    lifecycle_off: Any, emulator: EmulatorHandle
) -> None:
    wu = running_work_unit()
    artifact = xprof_artifact(wu)
    run_id = xprof.mlrun_id(wu.experiment_id, wu.wid, 1)
    url = xprof.console_url(PROJECT, LOCATION, run_id)
    for st in ("STARTING", "RUNNING"):
        transitions = set_state(wu, st)
        ctx = context(wu, "")  # no notify-when is stamped with the flag off
        hooks.on_jobset_observed(ctx, st)
        hooks.on_transitions_committed(transitions, {(wu.experiment_id, wu.wid, 1): context(wu, ALL)})
    run = emulator.emulator.run_by_id(run_id)
    assert run is not None and run["runPhase"] == "ACTIVE"
    assert run["workloadDetails"]["gke"]["cluster"] == CLUSTER
    posts = sum(1 for m, _ in emulator.emulator.requests if m == "POST")
    hooks.on_jobset_observed(context(wu, ""), "RUNNING")  # level-triggered, but calls out once per phase
    assert sum(1 for m, _ in emulator.emulator.requests if m == "POST") == posts
    assert execution(wu, 1).metadata["mlrunUrl"] == url
    # Not persisted with the flag off; the read path constructs the same URL.
    artifact.refresh_from_db()
    assert "xprof" not in artifact.payload["managedXprof"]
    got = artifact_to_proto(Artifact.objects.select_related("work_unit").get(id=artifact.id))
    assert got.payload.managed_xprof.xprof.xprof_url == url
    set_state(wu, "COMPLETED")
    hooks.on_jobset_observed(context(wu, ""), "COMPLETED")
    run = emulator.emulator.run_by_id(run_id)
    assert run is not None and run["runPhase"] == "COMPLETED"
    assert published() == []


def test_it_skips_the_legacy_sync_without_a_configured_service(lifecycle_off: Any, emulator: EmulatorHandle) -> None:
    lifecycle_off.XMC_MLRUN_PROJECT = ""
    wu = running_work_unit()
    xprof_artifact(wu)
    set_state(wu, "RUNNING")
    hooks.on_jobset_observed(context(wu, ""), "RUNNING")
    assert emulator.emulator.requests == []


def test_it_reads_the_persisted_url_before_a_constructed_one(lifecycle_on: Any, emulator: EmulatorHandle) -> None:
    from lifecycle import services

    wu = running_work_unit()
    artifact = xprof_artifact(wu)
    set_state(wu, "RUNNING")
    services.handle_event(events.LifecycleEvent(wu.experiment_id, wu.wid, 1, "STARTING", "RUNNING", 1))
    artifact.refresh_from_db()
    stored = artifact.payload["managedXprof"]["xprof"]["xprofUrl"]
    lifecycle_on.XMC_MLRUN_LOCATION = "europe-west4"  # a constructed URL would now differ
    got = artifact_to_proto(Artifact.objects.select_related("work_unit").get(id=artifact.id))
    assert got.payload.managed_xprof.xprof.xprof_url == stored
    assert "/us-central1/" in stored


def test_it_keeps_the_server_xprof_url_and_ignores_a_clients(lifecycle_on: Any, emulator: EmulatorHandle) -> None:
    from artifacts import services as artifact_services
    from lifecycle import services
    from core import pb

    wu = running_work_unit()
    spoofed = pb.artifact.Artifact(payload=pb.artifact.ArtifactPayload(managed_xprof=pb.artifact.ManagedXprofArtifact(
        display_name="p", run_group="gs://b/g", xprof=pb.artifact.XProfUIInstance(xprof_url="https://evil.example/"))))
    artifact = artifact_services.create_artifact(wu.experiment_id, wu.wid, spoofed)
    assert "xprof" not in artifact.payload["managedXprof"]  # OUTPUT_ONLY: the client's is dropped
    set_state(wu, "RUNNING")
    services.handle_event(events.LifecycleEvent(wu.experiment_id, wu.wid, 1, "STARTING", "RUNNING", 1))
    artifact.refresh_from_db()
    stored = artifact.payload["managedXprof"]["xprof"]["xprofUrl"]
    updated = artifact_services.update_artifact(artifact.id, spoofed, ["payload"])
    assert updated.payload["managedXprof"]["xprof"]["xprofUrl"] == stored
    assert updated.payload["managedXprof"]["displayName"] == "p"
