"""Bad input is INVALID_ARGUMENT (HTTP 400) naming the field, never INTERNAL / 500, and writes nothing."""
from __future__ import annotations

from typing import Any

import pytest

from core import errors, limits, pb
from core.pb import api
from core.pb import longrunning as lro
from experiments.models import Experiment
from tests.api.rest.conftest import ALICE, Api, World, grpc_call
from workunits.models import WorkUnit
from xmc.api.registry import ESS, OPERATIONS

pytestmark = pytest.mark.django_db


def invalid(response: Any, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    if field is not None:
        assert field in error["message"], error
    return dict(error)


def test_it_refuses_a_title_longer_than_the_column(world: World, alice_api: Api) -> None:
    before = Experiment.objects.count()
    invalid(alice_api.post("/v1/experiments", {"title": "t" * (limits.TITLE + 1)}), "experiment.title")
    assert Experiment.objects.count() == before


def test_it_refuses_a_long_tag_and_mime_type(world: World, alice_api: Api) -> None:
    invalid(alice_api.patch(f"/v1/experiments/{world.xid}", {"tags": ["x" * (limits.TAG + 1)]}), "experiment.tags[0]")
    invalid(alice_api.patch(f"/v1/{world.artifact_name}", {"mimeType": "m" * (limits.MIME_TYPE + 1)}),
            "artifact.mime_type")
    invalid(alice_api.post(f"/v1/experiments/{world.xid}/workUnits",
                           {"notes": "n" * (limits.NOTES + 1)}), "work_unit.notes")


@pytest.mark.parametrize("body_url,body", [
    ("/v1/experiments", {"title": "a\u0000b"}),
    ("/v1/experiments", {"notes": "\u0000"}),
    ("/v1/experiments", {"acls": {"owners": [{"user": "a\u0000@example.com"}]}}),
    ("/v1/experiments", {"urls": [{"url": "http://x/\u0000"}]}),
])
def test_it_refuses_nul_characters_in_any_text_field(world: World, alice_api: Api, body_url: str,
                                                     body: dict[str, Any]) -> None:
    before = Experiment.objects.count()
    invalid(alice_api.post(body_url, body), "NUL")
    assert Experiment.objects.count() == before


def test_it_refuses_nul_in_artifact_fields_and_filters(world: World, alice_api: Api) -> None:
    invalid(alice_api.patch(f"/v1/{world.artifact_name}", {"notes": "x\u0000"}), "artifact.notes")
    invalid(alice_api.get("/v1/experiments?filter=title%3D%22%00%22"), "filter")


def test_it_accepts_a_filter_time_with_an_offset_postgres_refuses(world: World, alice_api: Api) -> None:
    response = alice_api.get("/v1/experiments?filter=create_time%3E%222020-01-01T00:00:00%2B23:59%22")
    assert response.status_code == 200, response.content
    assert len(response.json()["experiments"]) == 1


def test_it_answers_a_huge_wait_timeout_without_overflow(world: World) -> None:
    for seconds in (10**15, -(10**15)):
        request = lro.WaitOperationRequest(name=world.create_operation)
        request.timeout.seconds = seconds
        if seconds > 0:
            # Not done: a positive timeout waits (capped); make it done first so the test is quick.
            from workunits.models import Operation
            Operation.objects.filter(work_unit__experiment_id=world.xid).update(done=True)
        grpc_call(OPERATIONS, "WaitOperation", request)


def test_it_answers_400_for_a_deeply_nested_json_body(alice_api: Api) -> None:
    body = '{"title": "x", "acls": ' + "[" * 100_000 + "]" * 100_000 + "}"
    invalid(alice_api.post("/v1/experiments", body))


def test_it_truncates_a_long_asserted_email_on_writes(world: World) -> None:
    from xmc.api.registry import Caller, invoke
    from xmc.auth.identity import Identity

    caller = Caller(identity=Identity(email=ALICE), asserted_email="a" * 5000 + "@example.com")
    invoke(ESS, "StopWorkUnit", api.StopWorkUnitRequest(name=world.wu1), caller)
    invoke(ESS, "RestartWorkUnit", api.RestartWorkUnitRequest(name=world.wu1), caller)


def test_it_answers_400_for_a_long_asserted_email_over_rest(world: World, alice_api: Api) -> None:
    response = alice_api.post(f"/v1/{world.wu1}:stop", {}, HTTP_X_GOOG_USER_EMAIL="a" * 5000 + "@example.com")
    assert response.status_code == 200, response.content


def test_it_bounds_explicit_work_unit_ids_so_allocation_never_overflows(world: World) -> None:
    executable = world.work_units[0].executable
    request = api.CreateWorkUnitRequest(parent=f"experiments/{world.xid}", work_unit_id=2**63 - 1)
    request.work_unit.executable.CopyFrom(pb.work_unit.Executable())
    from core.convert import from_json
    request.work_unit.executable.CopyFrom(from_json(pb.work_unit.Executable, executable))
    with pytest.raises(errors.InvalidArgument) as excinfo:
        grpc_call(ESS, "CreateWorkUnit", request)
    assert excinfo.value.field == "work_unit_id"
    # The largest allowed explicit id, then an automatic one: both fine.
    request.work_unit_id = limits.MAX_WORK_UNIT_ID
    grpc_call(ESS, "CreateWorkUnit", request)
    request.work_unit_id = 0
    grpc_call(ESS, "CreateWorkUnit", request)
    assert WorkUnit.objects.filter(experiment_id=world.xid, wid=limits.MAX_WORK_UNIT_ID + 1).exists()


@pytest.mark.parametrize("name", ["experiments/\u0663", "experiments/1\n", "experiments/99999999999999999999",
                                  "experiments/9999999999999999999"])
def test_it_refuses_names_with_non_ascii_digits_a_newline_or_out_of_range(world: World, name: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        grpc_call(ESS, "GetExperiment", api.GetExperimentRequest(name=name))
