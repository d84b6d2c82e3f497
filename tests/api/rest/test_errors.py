"""Every failure answers ``{"error": {"code", "status", "message"}}`` with the canonical HTTP status.

Handler errors (real handlers), DRF's own 401/405/429, malformed requests,
and unexpected exceptions all leave in the same shape.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from core import errors
from tests.api.rest.conftest import ALICE, Api, FakeInvoke, World
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db


def error_of(response: Any, http_status: int, status: str) -> dict[str, Any]:
    assert response.status_code == http_status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == http_status
    assert body["error"]["status"] == status
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


# --- 400 ------------------------------------------------------------------------------------


def test_it_answers_400_for_a_body_that_is_not_json(world: World, alice_api: Api) -> None:
    error = error_of(alice_api.post("/v1/experiments", "{not json"), 400, "INVALID_ARGUMENT")
    assert "not valid JSON" in error["message"]


def test_it_answers_400_naming_the_body_field_for_an_unknown_property(alice_api: Api) -> None:
    error = error_of(alice_api.post("/v1/experiments", {"title": "x", "colour": "red"}), 400, "INVALID_ARGUMENT")
    assert "colour" in error["message"]
    assert error["details"][0]["fieldViolations"][0]["field"] == "experiment"


def test_it_answers_400_for_an_enum_name_that_does_not_exist(world: World, alice_api: Api) -> None:
    response = alice_api.post(f"/v1/experiments/{world.xid}:updateLaunchState", {"launchState": "EXPLODED"})
    assert "EXPLODED" in error_of(response, 400, "INVALID_ARGUMENT")["message"]


def test_it_answers_400_for_a_page_size_that_is_not_a_number(alice_api: Api) -> None:
    error = error_of(alice_api.get("/v1/experiments?pageSize=ten"), 400, "INVALID_ARGUMENT")
    assert "pageSize" in error["message"]
    assert error["details"][0]["fieldViolations"][0]["field"] == "pageSize"


def test_it_answers_400_for_an_unknown_query_parameter(alice_api: Api) -> None:
    error = error_of(alice_api.get("/v1/experiments?pagesize=10"), 400, "INVALID_ARGUMENT")
    assert "unknown query parameter 'pagesize'" in error["message"]


def test_it_answers_400_for_a_query_parameter_when_the_body_is_the_whole_request(world: World,
                                                                                 alice_api: Api) -> None:
    response = alice_api.post(f"/v1/experiments/{world.xid}/workUnits:batchStop?filter=wid%3D1", {})
    assert "set by the path or the request body" in error_of(response, 400, "INVALID_ARGUMENT")["message"]


def test_it_passes_the_handlers_filter_error_on_with_its_field(world: World, alice_api: Api) -> None:
    error = error_of(alice_api.get(f"/v1/experiments/{world.xid}/workUnits?filter=colour%3Dred"), 400,
                     "INVALID_ARGUMENT")
    assert error["details"][0]["fieldViolations"][0]["field"] == "filter"


def test_it_answers_a_failed_precondition_with_400(world: World, alice_api: Api) -> None:
    response = alice_api.delete(f"/v1/operations/{world.create_operation}")  # still pending
    assert "not done" in error_of(response, 400, "FAILED_PRECONDITION")["message"]


# --- 401 ------------------------------------------------------------------------------------


def test_it_answers_401_with_a_bearer_challenge_when_there_is_no_token(world: World, anonymous_api: Api) -> None:
    response = anonymous_api.get(f"/v1/experiments/{world.xid}")
    assert "missing bearer token" in error_of(response, 401, "UNAUTHENTICATED")["message"]
    assert response["WWW-Authenticate"] == "Bearer"


def test_it_says_why_a_token_is_refused(world: World) -> None:
    expired = issue_token(ALICE, ttl_s=60, now=time.time() - 3600)
    response = Api(None).get(f"/v1/experiments/{world.xid}", HTTP_AUTHORIZATION=f"Bearer {expired}")
    assert error_of(response, 401, "UNAUTHENTICATED")["message"] == "invalid bearer token: token expired"
    assert response["WWW-Authenticate"] == "Bearer"


def test_it_trusts_the_token_and_not_the_asserted_email(world: World, bob_api: Api) -> None:
    response = bob_api.get(f"/v1/experiments/{world.xid}", HTTP_X_GOOG_USER_EMAIL=ALICE)
    error_of(response, 403, "PERMISSION_DENIED")


# --- 403, 404, 405 ------------------------------------------------------------------------------


def test_it_answers_403_when_bob_reads_alices_experiment(world: World, bob_api: Api) -> None:
    error = error_of(bob_api.get(f"/v1/experiments/{world.xid}"), 403, "PERMISSION_DENIED")
    assert error["message"] == f"bob@example.com may not read experiments/{world.xid}"


def test_it_answers_403_for_an_experiment_that_does_not_exist(alice_api: Api) -> None:
    # AIP-211: permission first; a missing experiment is no different from someone else's
    # (staff still get 404: tests/api/robustness/test_permission_first.py).
    error_of(alice_api.get("/v1/experiments/987654321"), 403, "PERMISSION_DENIED")


def test_it_answers_404_in_the_same_shape_for_a_path_with_no_binding(alice_api: Api) -> None:
    assert "no API method" in error_of(alice_api.get("/v1/experiments/1/nothing"), 404, "NOT_FOUND")["message"]
    error_of(alice_api.post("/v1/experiments/1:explode", {}), 404, "NOT_FOUND")


def test_it_answers_405_for_a_method_the_path_does_not_bind(world: World, alice_api: Api) -> None:
    response = alice_api.call("PUT", f"/v1/experiments/{world.xid}", {})
    error_of(response, 405, "UNIMPLEMENTED")
    assert response["Allow"] == "GET, PATCH"


# --- 429 ------------------------------------------------------------------------------------


def test_it_answers_429_with_retry_after_once_the_identity_is_out_of_budget(world: World, settings: Any) -> None:
    settings.XMC_RATE_LIMIT_PER_S = 0.001  # one token every ~17 minutes
    settings.XMC_RATE_LIMIT_BURST = 2
    hammer = Api(f"hammer-{uuid.uuid4().hex[:12]}@example.com")
    statuses = [hammer.get("/v1/experiments").status_code for _ in range(2)]
    limited = hammer.get("/v1/experiments")

    assert statuses == [200, 200]
    assert "rate limit" in error_of(limited, 429, "RESOURCE_EXHAUSTED")["message"]
    assert int(limited["Retry-After"]) > 60


# --- Every canonical code, and the unexpected --------------------------------------------------

CANONICAL = [
    (errors.InvalidArgument, 400),
    (errors.FailedPrecondition, 400),
    (errors.Unauthenticated, 401),
    (errors.PermissionDenied, 403),
    (errors.NotFound, 404),
    (errors.AlreadyExists, 409),
    (errors.Aborted, 409),
    (errors.ResourceExhausted, 429),
]


@pytest.mark.parametrize(("error_class", "http_status"), CANONICAL, ids=lambda v: getattr(v, "code", str(v)))
def test_it_maps_each_service_error_to_its_http_status(error_class: type[errors.ServiceError], http_status: int,
                                                       alice_api: Api, fake_invoke: FakeInvoke) -> None:
    fake_invoke.error = error_class("it went wrong", field="experiment.title")
    error = error_of(alice_api.get("/v1/experiments/1"), http_status, error_class.code)
    assert error["message"] == "it went wrong"
    assert error["details"] == [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                                 "fieldViolations": [{"field": "experiment.title", "description": "it went wrong"}]}]


@pytest.mark.parametrize(("code", "http_status"), [
    ("OUT_OF_RANGE", 400), ("CANCELLED", 499), ("UNIMPLEMENTED", 501), ("UNAVAILABLE", 503),
    ("DEADLINE_EXCEEDED", 504), ("INTERNAL", 500), ("UNKNOWN", 500), ("DATA_LOSS", 500),
])
def test_it_maps_the_rarer_codes_too(code: str, http_status: int, alice_api: Api, fake_invoke: FakeInvoke) -> None:
    error = errors.ServiceError("rare")
    error.code = code
    fake_invoke.error = error
    assert "details" not in error_of(alice_api.get("/v1/experiments/1"), http_status, code)


def test_it_answers_500_without_leaking_an_unexpected_exception(alice_api: Api, fake_invoke: FakeInvoke,
                                                                caplog: Any) -> None:
    fake_invoke.error = RuntimeError("database password is hunter2")
    error = error_of(alice_api.get("/v1/experiments/1"), 500, "INTERNAL")
    assert error["message"] == "internal error"
    assert "rest.unhandled_error" in caplog.text


def test_it_answers_413_for_a_body_over_the_upload_limit(world: World, alice_api: Api, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = alice_api.post("/v1/experiments", {"notes": "x" * 2048})
    assert "larger than" in error_of(response, 413, "RESOURCE_EXHAUSTED")["message"]
