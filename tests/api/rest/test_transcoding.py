"""How an HTTP call becomes the request message: the binding table, path, query, body and updateMask.

Most stories here record the message the handler would receive
(``fake_invoke``); the updateMask story runs the real UpdateExperiment.
"""
from __future__ import annotations

from typing import Any

import pytest
from google.api import annotations_pb2

from core import pb
from tests.api.rest.conftest import ALICE, Api, FakeInvoke, World
from xmc.api.registry import DASHBOARDS, ESS, OPERATIONS
from xmc.api.rest import BINDINGS, PathTemplate, parse_field_mask

pytestmark = pytest.mark.django_db


def _descriptor_bindings(service: Any = None) -> set[tuple[str, str, str, str]]:
    """(method, template, rpc, body) for every google.api.http rule of a service (ExperimentStateService)."""
    found = set()
    service = service or pb.api.DESCRIPTOR.services_by_name["ExperimentStateService"]
    for method in service.methods:
        rule = method.GetOptions().Extensions[annotations_pb2.http]
        for r in (rule, *rule.additional_bindings):
            verb = r.WhichOneof("pattern")
            found.add((verb.upper(), getattr(r, verb), method.name, r.body or rule.body))
    return found


def test_it_binds_exactly_the_http_rules_of_the_protos() -> None:
    ours = {(b.http_method, b.template, b.rpc, b.body) for b in BINDINGS if b.service == ESS}
    assert ours == _descriptor_bindings()
    assert len(ours) == 33
    assert {b.rpc for b in BINDINGS if b.service == ESS} == {
        m.name for m in pb.api.DESCRIPTOR.services_by_name["ExperimentStateService"].methods
    }


def test_it_binds_exactly_the_http_rules_of_the_dashboard_service() -> None:
    service = pb.dashboard_api.DESCRIPTOR.services_by_name["DashboardService"]
    ours = {(b.http_method, b.template, b.rpc, b.body) for b in BINDINGS if b.service == DASHBOARDS}
    assert ours == _descriptor_bindings(service)
    assert {b.rpc for b in BINDINGS if b.service == DASHBOARDS} == {m.name for m in service.methods}


def test_it_serves_get_operation_at_the_documented_path() -> None:
    assert ("GET", "/v1/operations/{name=**}") in {(b.http_method, b.template) for b in BINDINGS
                                                   if b.service == OPERATIONS and b.rpc == "GetOperation"}


def test_it_turns_a_template_into_a_django_regex_and_an_openapi_path() -> None:
    template = PathTemplate.parse("/v1/{name=experiments/*/workUnits/*}:stop")
    assert template.regex == r"^v1/(?P<p0>experiments/[^/:]+/workUnits/[^/:]+):stop$"
    assert template.openapi_path == "/v1/experiments/{xid}/workUnits/{wid}:stop"
    assert [name for name, _ in template.openapi_parameters] == ["xid", "wid"]
    assert PathTemplate.parse("/v1/operations/{name=**}").openapi_path == "/v1/operations/{name}"


def test_it_reads_field_masks_in_json_form_and_with_original_names() -> None:
    assert parse_field_mask(["title,status.launchState"]) == ["title", "status.launch_state"]
    assert parse_field_mask(["title, status.launch_state", "tags"]) == ["title", "status.launch_state", "tags"]
    assert parse_field_mask(["additionalInfo.codeBlock,,"]) == ["additional_info.code_block"]


def test_it_puts_the_path_variable_into_the_named_field(alice_api: Api, fake_invoke: FakeInvoke) -> None:
    alice_api.get("/v1/experiments/7/workUnits/3/currentExecution")
    service, method, request, _ = fake_invoke.calls[-1]
    assert (service, method) == (ESS, "GetCurrentWorkUnitExecution")
    assert request == pb.api.GetCurrentWorkUnitExecutionRequest(name="experiments/7/workUnits/3")


def test_it_takes_the_full_operation_name_after_v1_operations(alice_api: Api, fake_invoke: FakeInvoke) -> None:
    alice_api.get("/v1/operations/experiments/1/workUnits/2/operations/3")
    assert fake_invoke.calls[-1][:2] == (OPERATIONS, "GetOperation")
    assert fake_invoke.request.name == "experiments/1/workUnits/2/operations/3"


def test_it_accepts_query_parameters_by_json_name_and_by_original_name(alice_api: Api,
                                                                      fake_invoke: FakeInvoke) -> None:
    alice_api.get("/v1/experiments/4/workUnits?pageSize=5&pageToken=abc&orderBy=wid%20desc&filter=wid%3E1")
    camel = fake_invoke.request
    alice_api.get("/v1/experiments/4/workUnits?page_size=5&page_token=abc&order_by=wid%20desc&filter=wid%3E1")
    assert fake_invoke.request == camel == pb.api.ListWorkUnitsRequest(
        parent="experiments/4", page_size=5, page_token="abc", order_by="wid desc", filter="wid>1"
    )


def test_it_refuses_a_single_valued_query_parameter_given_twice(alice_api: Api, fake_invoke: FakeInvoke) -> None:
    response = alice_api.get("/v1/experiments?pageSize=5&pageSize=6")
    assert response.status_code == 400
    assert fake_invoke.calls == []


def test_it_sets_non_body_fields_from_the_query_next_to_a_body_field(alice_api: Api,
                                                                     fake_invoke: FakeInvoke) -> None:
    alice_api.post("/v1/experiments/4/workUnits?workUnitId=12", {"notes": "first"})
    assert fake_invoke.request == pb.api.CreateWorkUnitRequest(
        parent="experiments/4", work_unit_id=12, work_unit=pb.work_unit.WorkUnit(notes="first")
    )


def test_it_lets_the_path_win_over_the_body(alice_api: Api, fake_invoke: FakeInvoke) -> None:
    alice_api.post("/v1/experiments/4:updateLaunchState", {"name": "experiments/666", "launchState": "FAILED"})
    assert fake_invoke.request == pb.api.UpdateExperimentLaunchStateRequest(
        name="experiments/4", launch_state=pb.status.ExperimentStatus.LaunchState.FAILED
    )
    alice_api.patch("/v1/experiments/4?updateMask=title", {"name": "experiments/666", "title": "t"})
    assert fake_invoke.request.experiment.name == "experiments/4"


def test_it_reads_update_mask_from_the_query_in_either_spelling(alice_api: Api, fake_invoke: FakeInvoke) -> None:
    alice_api.patch("/v1/artifacts/9?updateMask=notes,lifecyclePhase&updateMask=additionalInfo.codeBlock",
                    {"notes": "n"})
    assert list(fake_invoke.request.update_mask.paths) == ["notes", "lifecycle_phase", "additional_info.code_block"]
    alice_api.patch("/v1/artifacts/9?update_mask=notes,lifecycle_phase", {"notes": "n"})
    assert list(fake_invoke.request.update_mask.paths) == ["notes", "lifecycle_phase"]
    assert fake_invoke.request.artifact == pb.artifact.Artifact(name="artifacts/9", notes="n")


def test_it_hands_the_asserted_email_to_the_handler_for_audit_only(alice_api: Api, fake_invoke: FakeInvoke) -> None:
    alice_api.get("/v1/experiments/1", HTTP_X_GOOG_USER_EMAIL="oscar@example.com")
    caller = fake_invoke.calls[-1][3]
    assert (caller.email, caller.asserted_email) == (ALICE, "oscar@example.com")


def test_it_answers_proto3_json_with_int64_as_strings_and_enums_by_name(alice_api: Api,
                                                                        fake_invoke: FakeInvoke) -> None:
    fake_invoke.response = pb.status_message.StatusMessage(
        name="experiments/1/statusMessages/2", execution_id=3,
        content=pb.structured_message.StructuredMessage(
            severity=pb.structured_message.StructuredMessage.Severity.WARNING, user_facing_text="slow"),
    )
    response = alice_api.get("/v1/experiments/1")
    assert response.json() == {"name": "experiments/1/statusMessages/2", "executionId": "3",
                               "content": {"severity": "WARNING", "userFacingText": "slow"}}


def test_it_applies_only_the_masked_fields_of_a_patch(world: World, alice_api: Api) -> None:
    response = alice_api.patch(f"/v1/experiments/{world.xid}?updateMask=title,tags",
                               {"title": "resnet sweep v2", "tags": ["v2"], "notes": "ignored"})
    assert response.status_code == 200, response.content
    assert (response.json()["title"], response.json()["tags"], response.json().get("notes")) == (
        "resnet sweep v2", ["v2"], None)


def test_it_refuses_an_unknown_mask_path_as_the_handler_says(world: World, alice_api: Api) -> None:
    response = alice_api.patch(f"/v1/experiments/{world.xid}?updateMask=colour", {"title": "x"})
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_it_implies_the_mask_from_the_body_when_a_patch_has_none(world: World, alice_api: Api) -> None:
    response = alice_api.patch(f"/v1/experiments/{world.xid}", {"name": "ignored", "title": "t2", "tags": []})
    assert response.status_code == 200, response.content
    assert (response.json()["title"], response.json().get("tags")) == ("t2", None)


def test_it_leaves_a_patch_with_nothing_to_update_to_the_handler(world: World, alice_api: Api) -> None:
    response = alice_api.patch(f"/v1/{world.wu1}", {})
    assert response.status_code == 400
    assert response.json()["error"]["details"][0]["fieldViolations"][0]["field"] == "update_mask"


def test_it_speaks_the_alt_parameter_of_googles_rest_clients(world: World, alice_api: Api) -> None:
    by_number = alice_api.get(f"/v1/experiments/{world.xid}?%24alt=json%3Benum-encoding%3Dint").json()
    assert by_number["priority"] == pb.priority.Priority.NORMAL
    assert alice_api.get(f"/v1/experiments/{world.xid}?alt=json").json()["priority"] == "NORMAL"
    assert alice_api.get(f"/v1/experiments/{world.xid}?alt=proto").status_code == 400
