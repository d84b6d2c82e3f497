"""The OpenAPI document lists every binding with schemas from the descriptors, and the docs page works offline."""
from __future__ import annotations

import re
from typing import Any

import pytest
from openapi_spec_validator import validate

from tests.api.rest.conftest import Api
from xmc.api.openapi import build_document
from xmc.api.rest import BINDINGS

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_document()


def schema(document: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(document["components"]["schemas"][name])


def test_it_is_a_valid_openapi_3_document(document: dict[str, Any]) -> None:
    validate(document)
    assert document["openapi"].startswith("3.")


def test_it_lists_every_binding_once(document: dict[str, Any]) -> None:
    ops = [(method, op) for item in document["paths"].values() for method, op in item.items()]
    listed = {(method.upper(), op["x-path-template"]) for method, op in ops if not op.get("x-not-an-rpc")}
    assert listed == {(b.http_method, b.template) for b in BINDINGS}
    operation_ids = [op["operationId"] for _, op in ops]
    extra = {"GetExecutionLogs", "ListSubscriptions", "CreateSubscription", "GetSubscription", "UpdateSubscription",
             "DeleteSubscription", "TestSubscription", "RotateSubscriptionSecret", "ListSubscriptionDeliveries",
                 "WriteMetrics", "SummarizeWorkUnits", "GetParameterImportance", "ListHeadlines",
             "CreateStudy", "ListStudies", "GetStudy", "StopStudy", "GetUsage", "ListQueues", "ListPendingWorkloads"}
    assert set(operation_ids) - {op["operationId"] for _, op in ops if not op.get("x-not-an-rpc")} == extra
    assert len(operation_ids) == len(set(operation_ids)) == len(BINDINGS) + len(extra)


def test_it_documents_the_logs_endpoint(document: dict[str, Any]) -> None:
    logs = document["paths"]["/v1/experiments/{xid}/workUnits/{wid}/executions/{eid}/logs"]["get"]
    assert logs["operationId"] == "GetExecutionLogs"
    assert [p["name"] for p in logs["parameters"] if p["in"] == "query"] == [
        "replica", "container", "follow", "tailLines", "sinceTime", "previous", "timestamps", "format"]
    assert set(logs["responses"]["200"]["content"]) == {"text/plain", "application/x-ndjson"}


def test_it_documents_the_headlines_sentence_and_reason(document: dict[str, Any]) -> None:
    """The one "why is it not running" (workunits.headline) is part of the documented answer, camelCase."""
    row = (document["paths"]["/v1/experiments/{xid}/headlines"]["get"]["responses"]["200"]["content"]
           ["application/json"]["schema"]["properties"]["headlines"]["items"])
    assert {"name", "executionId", "state", "headline", "sentence", "reason"} <= set(row["properties"])
    assert {"code", "positionInQueue", "totalInQueue", "exitCode", "retryLimit"} <= set(row["properties"]["reason"]["properties"])


def test_it_spells_paths_with_one_parameter_per_id(document: dict[str, Any]) -> None:
    stop = document["paths"]["/v1/experiments/{xid}/workUnits/{wid}:stop"]["post"]
    assert [(p["name"], p["in"], p["required"]) for p in stop["parameters"]] == [
        ("xid", "path", True), ("wid", "path", True)]
    assert stop["x-grpc-method"] == "/cloud.xmanager.v1.ExperimentStateService/StopWorkUnit"
    assert stop["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/google.longrunning.Operation"}


def test_it_offers_list_query_parameters_in_proto3_json_names(document: dict[str, Any]) -> None:
    listing = document["paths"]["/v1/experiments/{xid}/workUnits"]["get"]
    assert [p["name"] for p in listing["parameters"] if p["in"] == "query"] == [
        "pageSize", "pageToken", "filter", "orderBy"]
    patch = document["paths"]["/v1/experiments/{xid}"]["patch"]
    assert [(p["name"], p["schema"]["type"]) for p in patch["parameters"] if p["in"] == "query"] == [
        ("updateMask", "string")]
    create = document["paths"]["/v1/experiments/{xid}/workUnits"]["post"]
    assert [(p["name"], p["schema"]) for p in create["parameters"] if p["in"] == "query"] == [
        ("workUnitId", {"type": "string", "format": "int64"})]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/cloud.xmanager.v1.WorkUnit"}


def test_it_derives_schemas_from_the_descriptors_in_proto3_json_form(document: dict[str, Any]) -> None:
    experiment = schema(document, "cloud.xmanager.v1.Experiment")["properties"]
    assert {"createTime", "completeTime", "acls", "status", "tags", "resources"} <= set(experiment)
    assert experiment["tags"] == {"type": "array", "items": {"type": "string"}}
    # status is OUTPUT_ONLY in the protos
    assert experiment["status"] == {"allOf": [{"$ref": "#/components/schemas/cloud.xmanager.v1.ExperimentStatus"}],
                                    "readOnly": True}
    assert experiment["priority"] == {"$ref": "#/components/schemas/cloud.xmanager.v1.Priority"}
    assert schema(document, "cloud.xmanager.v1.Priority")["enum"] == ["PRIORITY_UNSPECIFIED", "LOW", "NORMAL", "HIGH"]
    assert "date-time" in str(experiment["createTime"])
    cpu = schema(document, "cloud.xmanager.v1.CpuResources")["properties"]
    assert cpu["memoryBytes"] == {"type": "string", "format": "int64"}
    assert schema(document, "google.longrunning.Operation")["properties"]["metadata"]["properties"] == {
        "@type": {"type": "string"}}


def test_it_refers_only_to_schemas_it_defines(document: dict[str, Any]) -> None:
    refs = set(re.findall(r"'#/components/schemas/([^']+)'", str(document)))
    assert refs and refs <= set(document["components"]["schemas"])


def test_it_serves_the_document_and_the_page_without_a_token(anonymous_api: Api, document: dict[str, Any]) -> None:
    response = anonymous_api.get("/v1/openapi.json")
    assert response.status_code == 200
    assert response.json() == document

    page = anonymous_api.get("/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert '"openapi.json"' in html and "fetch(" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the page must not load external assets"
    assert "<script src" not in html and "<link" not in html


def test_it_offers_an_example_body_of_the_settable_fields(document: dict[str, Any]) -> None:
    def example(path: str, method: str) -> Any:
        return document["paths"][path][method]["requestBody"]["content"]["application/json"]["example"]

    assert example("/v1/experiments/{xid}:updateLaunchState", "post") == {"launchState": "LAUNCHING"}
    assert example("/v1/experiments/{xid}/workUnits:batchStop", "post") == {"filter": ""}
    assert example("/v1/experiments", "post") == {"title": "", "priority": "LOW", "tags": [], "notes": ""}
