"""The pure rules of STATES.md "Actuator preconditions" and the error classes."""
from __future__ import annotations

import random
from typing import Any

import pytest

from k8s_bridge.actuator.preconditions import (
    Decision,
    ExecutionView,
    execution_skip_reason,
    removal_decision,
    restart_decision,
    validate_update_mask,
    verify_duplicate_jobset,
)
from core import errors as service_errors
from core.task_wire import InvalidTask
from k8s_bridge.client import ApiException
from delivery.backoff import jittered as backoff_seconds
from k8s_bridge.errors import ActuatorError, classify


def js(eid: int | None, last_edit: int = 100, *, xid: int = 1, wid: int = 2, deleting: bool = False) -> dict[str, Any]:
    labels = {"xmc.google.com/xid": str(xid), "xmc.google.com/wid": str(wid), "xmc.google.com/last-edit": str(last_edit)}
    if eid is not None:
        labels["xmc.google.com/execution-id"] = str(eid)
    meta: dict[str, Any] = {"name": "xmc-1-2", "uid": "u", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


@pytest.mark.parametrize("view, reason", [
    (None, "no longer exists"),
    (ExecutionView(current_eid=2, state="RESTARTING"), "no longer current"),
    (ExecutionView(current_eid=1, state="STOPPING"), "STOPPING"),
    (ExecutionView(current_eid=1, state="STOPPED"), "STOPPED"),
    (ExecutionView(current_eid=1, state="FAILED"), "FAILED"),
])
def test_it_skips_a_create_for_an_execution_that_moved_on(view: ExecutionView | None, reason: str) -> None:
    assert reason in (execution_skip_reason(view, 1) or "")


def test_it_lets_a_create_of_the_current_initializing_execution_go_on() -> None:
    assert execution_skip_reason(ExecutionView(current_eid=1, state="INITIALIZING"), 1) is None


def test_it_accepts_an_existing_jobset_with_our_labels_and_refuses_a_foreign_one() -> None:
    verify_duplicate_jobset(js(3), 1, 2, 3)
    for foreign in (js(2), js(3, xid=9), js(None), {"metadata": {"name": "xmc-1-2"}}):
        with pytest.raises(ActuatorError) as info:
            verify_duplicate_jobset(foreign, 1, 2, 3)
        assert info.value.code == "FAILED_PRECONDITION"


def test_it_decides_removal_by_eid_last_edit_and_deletion() -> None:
    assert removal_decision(None, 1, 200) == Decision.DONE
    assert removal_decision(js(2), 1, 200) == Decision.SUPERSEDED
    assert removal_decision(js(1), 1, 200) == Decision.ACT
    assert removal_decision(js(1), 2, 200) == Decision.ACT
    assert removal_decision(js(1, deleting=True), 1, 200) == Decision.WAIT
    with pytest.raises(ActuatorError) as info:
        removal_decision(js(1, last_edit=300), 1, 200)
    assert info.value.code == "FAILED_PRECONDITION"


def test_it_decides_restart_steps() -> None:
    assert restart_decision(None, 2, 1, 200) == Decision.ACT
    assert restart_decision(js(1), 2, 1, 200) == Decision.WAIT
    assert restart_decision(js(1, deleting=True), 2, 1, 200) == Decision.WAIT
    assert restart_decision(js(2), 2, 1, 200) == Decision.DONE
    assert restart_decision(js(5), 2, 1, 200) == Decision.DONE


def test_it_knows_only_the_notify_when_mask() -> None:
    validate_update_mask(["metadata.annotations.notify-when"], frozenset({"metadata.annotations.notify-when"}))
    for paths in ([], ["spec.suspend"]):
        with pytest.raises(ActuatorError):
            validate_update_mask(paths, frozenset({"metadata.annotations.notify-when"}))


def api(status: int, reason: str = "") -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = '{"message": "boom"}'
    return exc


@pytest.mark.parametrize("exc, code, permanent", [
    (api(404, "Not Found"), "NOT_FOUND", True),
    (api(422, "Unprocessable Entity"), "INVALID_ARGUMENT", True),
    (api(400), "INVALID_ARGUMENT", True),
    (api(403), "PERMISSION_DENIED", True),
    (api(409), "ABORTED", False),
    (api(429), "RESOURCE_EXHAUSTED", False),
    (api(500), "INTERNAL", False),
    (api(503), "UNAVAILABLE", False),
    (api(0), "UNAVAILABLE", False),
    (ConnectionRefusedError("no"), "UNAVAILABLE", False),
    (TimeoutError("slow"), "UNAVAILABLE", False),
    (InvalidTask("tampered"), "INVALID_ARGUMENT", True),
    (ActuatorError("FAILED_PRECONDITION", "x"), "FAILED_PRECONDITION", True),
    (ActuatorError("UNAVAILABLE", "x"), "UNAVAILABLE", False),
    (service_errors.InvalidArgument("x", field="f"), "INVALID_ARGUMENT", True),
    (service_errors.PermissionDenied("x"), "PERMISSION_DENIED", True),
    (service_errors.NotFound("x"), "NOT_FOUND", True),
])
def test_it_classifies_every_error_in_one_place(exc: BaseException, code: str, permanent: bool) -> None:
    c = classify(exc)
    assert (c.code, c.permanent) == (code, permanent)


def test_it_backs_off_exponentially_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(7)
    waits = [backoff_seconds(n, base=1.0, cap=60.0, rng=rng) for n in range(10)]
    for n, wait in enumerate(waits):
        ceiling = min(60.0, 2.0 ** n)
        assert ceiling / 2 <= wait <= ceiling
    assert len({round(backoff_seconds(3, base=1.0, cap=60.0, rng=rng), 6) for _ in range(20)}) > 1
