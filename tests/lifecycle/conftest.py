"""Fixtures of the artifact lifecycle tests: the MachineLearningRun emulator and the flag.

The emulator (``simulators.mlrun``) runs in-process on a free
port; ``lifecycle_on`` turns the flag on and points the settings at it, the
way ``./dev run`` does for the local system.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from artifacts import services as artifact_services
from artifacts.models import Artifact
from core import convert, pb
from lifecycle import events, rules, services
from lifecycle.events import LifecycleEvent, Runtime
from simulators.mlrun import EmulatorHandle, run_emulator
from tests import factories
from workunits import services as wu_services
from workunits import state
from workunits.models import WorkUnit, WorkUnitExecution
from workunits.services import Transition

PROJECT = "proj"
LOCATION = "us-central1"
CLUSTER = f"projects/{PROJECT}/locations/{LOCATION}/clusters/c1"


@pytest.fixture
def emulator() -> Iterator[EmulatorHandle]:
    handle = run_emulator(port=0, op_polls=1)
    yield handle
    handle.stop()


def _reset() -> None:
    rules._cache = None
    events.tracker.clear()
    services.legacy.clear()


@pytest.fixture
def mlrun_settings(settings: Any, emulator: EmulatorHandle) -> Iterator[Any]:
    settings.XMC_MLRUN_ENDPOINT = emulator.url
    settings.XMC_MLRUN_PROJECT = PROJECT
    settings.XMC_MLRUN_LOCATION = LOCATION
    settings.XMC_MLRUN_TOKEN = "test-token"
    settings.XMC_GKE_CLUSTER = CLUSTER
    _reset()
    yield settings
    _reset()


@pytest.fixture
def lifecycle_on(mlrun_settings: Any) -> Any:
    mlrun_settings.XMC_ARTIFACT_LIFECYCLE_ENABLED = True
    _reset()
    return mlrun_settings


@pytest.fixture
def lifecycle_off(mlrun_settings: Any) -> Any:
    mlrun_settings.XMC_ARTIFACT_LIFECYCLE_ENABLED = False
    _reset()
    return mlrun_settings


def set_state(wu: WorkUnit, st: str) -> list[Transition]:
    wu.refresh_from_db()
    return wu_services.update_work_unit_executions([state.ExecutionUpdate(
        xid=wu.experiment_id, wid=wu.wid, eid=wu.current_eid, mask=(state.STATE,), state=st,
        state_update_time_ns=convert.ns_from_datetime(timezone.now()) + 1_000_000,
    )])


def xprof_artifact(wu: WorkUnit, display_name: str = "profile", run_group: str = "gs://bucket/sweep-a") -> Artifact:
    message = pb.artifact.Artifact(payload=pb.artifact.ArtifactPayload(
        managed_xprof=pb.artifact.ManagedXprofArtifact(display_name=display_name, run_group=run_group)
    ))
    return artifact_services.create_artifact(wu.experiment_id, wu.wid, message)


def running_work_unit(title: str = "exp") -> WorkUnit:
    exp = factories.experiment(title=title)
    wu = factories.work_unit(exp, wid=1)
    return wu


def event_for(wu: WorkUnit, new_state: str, *, old_state: str = "", eid: int | None = None,
              force: bool = False) -> LifecycleEvent:
    wu.refresh_from_db()
    return LifecycleEvent(
        xid=wu.experiment_id, wid=wu.wid, eid=eid if eid is not None else wu.current_eid,
        old_state=old_state, new_state=new_state, event_time_ns=time.time_ns(), force_notify=force,
        runtime=Runtime(cluster=CLUSTER, namespace="default", name=f"xmc-{wu.experiment_id}-{wu.wid}",
                        uid="uid-1", creation_time_ns=1_700_000_000_000_000_000),
    )


def execution(wu: WorkUnit, eid: int) -> WorkUnitExecution:
    return WorkUnitExecution.objects.get(work_unit=wu, eid=eid)
