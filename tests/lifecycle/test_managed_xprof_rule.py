"""ManagedXprofRule against the MachineLearningRun emulator (real HTTP, real Postgres)."""
from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from artifacts import xprof
from artifacts.models import Artifact
from lifecycle import rules, services
from lifecycle.apps import check_lifecycle_configuration
from lifecycle.mlrun_client import MLRunClient, MLRunError
from simulators.mlrun import EmulatorHandle
from tests.lifecycle.conftest import CLUSTER, LOCATION, PROJECT, event_for, execution, running_work_unit, set_state, \
    xprof_artifact
from workunits import services as wu_services

pytestmark = pytest.mark.django_db


def run_of(emulator: EmulatorHandle, xid: int, wid: int, eid: int) -> dict[str, Any] | None:
    return emulator.emulator.run_by_id(xprof.mlrun_id(xid, wid, eid))


def count(emulator: EmulatorHandle, method: str) -> int:
    return sum(1 for m, path in emulator.emulator.requests if m == method and "/operations/" not in path)


def stored_url(artifact: Artifact) -> str:
    artifact.refresh_from_db()
    return str(((artifact.payload or {}).get("managedXprof") or {}).get("xprof", {}).get("xprofUrl", ""))


def test_it_creates_one_active_run_per_execution_with_the_request_built_from_the_artifact(
    lifecycle_on: Any, emulator: EmulatorHandle
) -> None:
    wu = running_work_unit(title="My experiment")
    artifact = xprof_artifact(wu)
    set_state(wu, "RUNNING")
    event = event_for(wu, "RUNNING", old_state="STARTING")
    services.handle_event(event)
    services.handle_event(event)  # redelivered: no second run, no second create

    run = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run is not None
    assert run["runPhase"] == "ACTIVE" and run["state"] == "STATE_ACTIVE"
    assert run["displayName"] == "profile"
    assert run["runSet"] == run["runGroup"] == "sweep-a"
    assert run["artifacts"] == {"gcsPath": "gs://bucket/sweep-a"}
    assert run["tools"] == [{"xprof": {}}]
    assert run["orchestrator"] == "GKE"
    gke = run["workloadDetails"]["gke"]
    assert gke == {"id": f"xmc-{wu.experiment_id}-1", "kind": "JobSet", "cluster": CLUSTER, "namespace": "default",
                   "createTime": "2023-11-14T22:13:20Z"}
    assert count(emulator, "POST") == 1
    url = xprof.console_url(PROJECT, LOCATION, xprof.mlrun_id(wu.experiment_id, wu.wid, 1))
    assert url.startswith("https://console.cloud.google.com/kubernetes/aiml/run/us-central1/xmc-")
    assert stored_url(artifact) == url
    assert execution(wu, 1).metadata["mlrunUrl"] == url


def test_it_falls_back_to_the_experiment_title_and_a_generated_group(lifecycle_on: Any, emulator: EmulatorHandle) -> None:
    wu = running_work_unit(title="Sweep 7")
    xprof_artifact(wu, display_name="", run_group="")
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "RUNNING"))
    run = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run is not None
    assert run["displayName"] == "Sweep 7"
    assert run["runGroup"] == f"xmc-{wu.experiment_id}"
    assert "artifacts" not in run


@pytest.mark.parametrize(("terminal", "phase"), [("COMPLETED", "COMPLETED"), ("FAILED", "FAILED"),
                                                 ("STOPPED", "FAILED")])
def test_it_moves_the_run_to_its_terminal_phase(
    lifecycle_on: Any, emulator: EmulatorHandle, terminal: str, phase: str
) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "RUNNING"))
    services.handle_event(event_for(wu, terminal, old_state="RUNNING"))
    run = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run is not None
    assert run["runPhase"] == phase and run["state"] == f"STATE_{phase}"
    assert run["endTime"] != "0001-01-01T00:00:00Z"


def test_it_never_moves_the_run_phase_backwards_or_between_terminal_phases(
    lifecycle_on: Any, emulator: EmulatorHandle
) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "RUNNING"))
    services.handle_event(event_for(wu, "COMPLETED", old_state="RUNNING"))
    patches = count(emulator, "PATCH")
    services.handle_event(event_for(wu, "RUNNING"))  # a late, reordered event
    services.handle_event(event_for(wu, "FAILED"))
    run = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run is not None and run["runPhase"] == "COMPLETED"
    assert count(emulator, "PATCH") == patches


def test_it_rereads_and_retries_on_an_etag_conflict(lifecycle_on: Any, emulator: EmulatorHandle) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "RUNNING"))
    # A concurrent writer changes the etag between our read and our write.
    emulator.inject(method="PATCH", action="touch", times=1)
    services.handle_event(event_for(wu, "COMPLETED"))
    run = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run is not None and run["runPhase"] == "COMPLETED"
    assert count(emulator, "PATCH") == 2  # the first was refused with ABORTED
    assert count(emulator, "GET") >= 2


def test_it_gives_up_and_raises_when_the_conflict_persists(lifecycle_on: Any, emulator: EmulatorHandle) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "RUNNING"))
    emulator.inject(method="PATCH", action="touch", times=rules.MAX_ATTEMPTS)
    with pytest.raises(MLRunError) as caught:
        services.handle_event(event_for(wu, "COMPLETED"))
    assert caught.value.status == "ABORTED"


def test_it_treats_not_found_on_a_close_path_as_closed(lifecycle_on: Any, emulator: EmulatorHandle,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "RUNNING"))
    client = MLRunClient.from_settings()
    client.delete(xprof.mlrun_id(wu.experiment_id, wu.wid, 1))  # deleted outside XMC
    caplog.set_level("INFO", logger="lifecycle.rules")
    services.handle_event(event_for(wu, "COMPLETED"))  # no error: counts as closed
    assert run_of(emulator, wu.experiment_id, wu.wid, 1) is None
    assert any(r.levelname == "INFO" and "not_found_treated_as_closed" in r.getMessage() for r in caplog.records)


def test_it_creates_the_run_again_when_it_was_deleted_outside_on_the_active_path(
    lifecycle_on: Any, emulator: EmulatorHandle
) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "STARTING"))
    MLRunClient.from_settings().delete(xprof.mlrun_id(wu.experiment_id, wu.wid, 1))
    services.handle_event(event_for(wu, "RUNNING"))
    run = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run is not None and run["runPhase"] == "ACTIVE"


def test_it_raises_other_service_errors_so_the_event_is_redelivered(lifecycle_on: Any, emulator: EmulatorHandle) -> None:
    wu = running_work_unit()
    artifact = xprof_artifact(wu)
    set_state(wu, "RUNNING")
    emulator.inject(method="GET", status="UNAVAILABLE", times=1)
    with pytest.raises(MLRunError) as caught:
        services.handle_event(event_for(wu, "RUNNING"))
    assert caught.value.status == "UNAVAILABLE"
    emulator.inject(method="POST", action="operation", status="INTERNAL", times=1)
    with pytest.raises(MLRunError) as caught:
        services.handle_event(event_for(wu, "RUNNING"))
    assert caught.value.status == "INTERNAL"
    assert stored_url(artifact) == ""  # nothing persisted after a failed create
    services.handle_event(event_for(wu, "RUNNING"))  # the redelivery succeeds
    assert stored_url(artifact) != ""


def test_it_closes_the_superseded_run_and_creates_nothing_for_a_late_event(
    lifecycle_on: Any, emulator: EmulatorHandle
) -> None:
    wu = running_work_unit()
    artifact = xprof_artifact(wu)
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "RUNNING"))
    first_url = stored_url(artifact)
    wu_services.restart_work_units(wu.experiment_id, [wu.wid], batch=False)
    # The restart's close of eid 1, as the Celery task runs it.
    services.close_superseded(wu.experiment_id, wu.wid, 1)
    run1 = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run1 is not None and run1["runPhase"] == "FAILED"
    assert run1["errorDetails"] == rules.SUPERSEDED_DETAILS
    # A late RUNNING event for eid 1 neither re-opens it nor touches the artifact.
    services.handle_event(event_for(wu, "RUNNING", eid=1))
    run1 = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run1 is not None and run1["runPhase"] == "FAILED"
    assert stored_url(artifact) == first_url
    # A late event for a superseded execution whose run never existed creates none.
    wu_services.restart_work_units(wu.experiment_id, [wu.wid], batch=False)
    services.handle_event(event_for(wu, "RUNNING", eid=2))
    assert run_of(emulator, wu.experiment_id, wu.wid, 2) is None
    # The new execution gets its own run.
    set_state(wu, "RUNNING")
    services.handle_event(event_for(wu, "RUNNING"))
    run3 = run_of(emulator, wu.experiment_id, wu.wid, 3)
    assert run3 is not None and run3["runPhase"] == "ACTIVE"
    assert stored_url(artifact).endswith(f"/{xprof.mlrun_id(wu.experiment_id, wu.wid, 3)}?project={PROJECT}")


def test_it_parses_an_older_url_form_when_closing_a_superseded_run(lifecycle_on: Any, emulator: EmulatorHandle) -> None:
    wu = running_work_unit()
    xprof_artifact(wu)
    client = MLRunClient.from_settings()
    request = rules.build_run_request(xid=wu.experiment_id, wid=wu.wid, eid=1, artifact=Artifact(payload={}),
                                      runtime=event_for(wu, "RUNNING").runtime)
    client.create("legacy-run-7", request)
    older = f"https://console.cloud.google.com/cluster-director/runs/legacy-run-7?project={PROJECT}"
    rules.registry()[0].close_superseded(wu.experiment_id, wu.wid, 1, older)
    run = emulator.emulator.run_by_id("legacy-run-7")
    assert run is not None and run["runPhase"] == "FAILED"


def test_it_fences_the_xprof_url_on_the_current_execution(
    lifecycle_on: Any, emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    wu = running_work_unit()
    artifact = xprof_artifact(wu)
    set_state(wu, "RUNNING")
    rule = rules.registry()[0]
    assert isinstance(rule, rules.ManagedXprofRule)
    real_create = rule.client.create

    def create_then_restart(run_id: str, run: dict[str, Any]) -> dict[str, Any]:
        created = real_create(run_id, run)
        wu_services.restart_work_units(wu.experiment_id, [wu.wid], batch=False)  # a restart wins the race
        return created

    monkeypatch.setattr(rule.client, "create", create_then_restart)
    services.handle_event(event_for(wu, "RUNNING", eid=1))
    assert stored_url(artifact) == ""  # the fence refused the stale write
    assert "mlrunUrl" not in execution(wu, 1).metadata
    run = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run is not None and run["runPhase"] == "FAILED"  # closed at once


def test_it_reports_missing_project_or_location_at_start_up(lifecycle_on: Any) -> None:
    lifecycle_on.XMC_MLRUN_LOCATION = ""
    rules._cache = None
    with pytest.raises(ImproperlyConfigured, match="XMC_MLRUN_LOCATION"):
        rules.check_configuration()
    errors = check_lifecycle_configuration()
    assert [e.id for e in errors] == ["lifecycle.E001"] and "XMC_MLRUN_LOCATION" in errors[0].msg


def test_it_has_no_rules_with_the_flag_off(lifecycle_off: Any) -> None:
    lifecycle_off.XMC_MLRUN_PROJECT = ""
    assert rules.registry() == []
    assert check_lifecycle_configuration() == []


def test_it_builds_the_console_url_in_one_form_and_parses_both() -> None:
    url = xprof.console_url("p", "us-central1", "xmc-1-2-3")
    assert url == "https://console.cloud.google.com/kubernetes/aiml/run/us-central1/xmc-1-2-3?project=p"
    assert xprof.parse_run_id(url) == "xmc-1-2-3"
    assert xprof.parse_run_id("https://console.cloud.google.com/x/runs/old-id?project=p") == "old-id"
    assert xprof.parse_run_id("https://example.com/") == ""


def test_it_closes_a_run_created_by_an_active_event_handled_after_the_terminal_one(
    lifecycle_on: Any, emulator: EmulatorHandle
) -> None:
    wu = running_work_unit()
    artifact = xprof_artifact(wu)
    set_state(wu, "RUNNING")
    set_state(wu, "COMPLETED")
    services.handle_event(event_for(wu, "COMPLETED", old_state="RUNNING"))  # finds no run: counts as closed
    assert run_of(emulator, wu.experiment_id, wu.wid, 1) is None
    services.handle_event(event_for(wu, "RUNNING", old_state="STARTING"))  # the reordered active event
    run = run_of(emulator, wu.experiment_id, wu.wid, 1)
    assert run is not None and run["runPhase"] == "COMPLETED"  # not left ACTIVE
    assert stored_url(artifact) != ""
