"""REST for studies (`studies.services`): create, read, list, stop. Not RPCs: no such message in the protos.

* ``POST /v1/experiments/{xid}/studies``: the study request (docs/architecture/studies.md), WRITER;
* ``GET /v1/experiments/{xid}/studies``: the experiment's studies, newest first, paginated (``pageSize``,
  ``pageToken``), READER;
* ``GET /v1/experiments/{xid}/studies/{id}``: the study with a page of its trials (by number;
  ``pageSize``, ``pageToken``), their counts and the best trial, READER;
* ``POST /v1/experiments/{xid}/studies/{id}:stop``: WRITER.

Access first (a caller who may not read the experiment gets PERMISSION_DENIED whatever else is
wrong), then INVALID_ARGUMENT naming the field; every list is paginated in the database
(`xmc.listing`).
"""
from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db.models import QuerySet
from django.urls import URLPattern, path
from rest_framework.request import Request
from rest_framework.response import Response

from core import names
from core.errors import InvalidArgument
from experiments.acl import Role
from studies import services
from studies.models import Study, Trial
from xmc import listing
from xmc.api import reads
from xmc.api.rest import BearerView, PayloadTooLarge
from xmc.api.sweeps import _int_param, _param

_LISTING_FIELDS = {"PageTokenError": "pageToken", "PageSizeError": "pageSize"}


def _page(queryset: QuerySet[Any], request: Request, order: list[listing.OrderTerm], what: str) -> tuple[list[int], str]:
    """The pks of one page of ``queryset`` in ``order`` and the next page's token."""
    try:
        keys, token = listing.paginate(
            queryset.values("pk"), order=order,
            page_size=listing.resolve_page_size(_int_param(request, "pageSize", "page_size")),
            page_token=_param(request, "pageToken", "page_token"), fingerprint=listing.fingerprint_of(what))
    except listing.ListingError as exc:
        raise InvalidArgument(str(exc), field=_LISTING_FIELDS.get(type(exc).__name__)) from None
    return [key["pk"] for key in keys], token


def _body(request: Request) -> Any:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise PayloadTooLarge() from None
    try:
        return json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the body is not JSON: {exc}", field="body") from None


class StudiesView(BearerView):
    http_method_names = ["get", "post"]

    def post(self, request: Request, xid: int) -> Response:
        reads.experiment(int(xid), request.user.identity, Role.WRITER)
        study = services.create_study(int(xid), _body(request), creator=request.user.identity.email)
        return Response(services.study_json(study, trials=[], trial_counts=services.counts(study.id)))

    def get(self, request: Request, xid: int) -> Response:
        reads.experiment(int(xid), request.user.identity, Role.READER)
        order = listing.parse_order_by("", {"id": "pk"}, default=("id desc",))
        pks, token = _page(services.list_studies(int(xid)), request, order, f"studies|experiments/{xid}")
        by_pk = Study.objects.in_bulk(pks)
        return Response({"studies": [services.study_json(by_pk[pk]) for pk in pks if pk in by_pk],
                         "nextPageToken": token})


class StudyView(BearerView):
    http_method_names = ["get"]

    def get(self, request: Request, xid: int, study_id: int) -> Response:
        reads.experiment(int(xid), request.user.identity, Role.READER)
        study = services.get_study(int(xid), int(study_id))
        order = listing.parse_order_by("", {"number": "number"}, default=("number",),
                                       unique_lookups=("number",))
        pks, token = _page(services.trials_of(study.id), request, order, f"trials|{study.name}")
        by_pk = Trial.objects.in_bulk(pks)
        body = services.study_json(study, trials=[by_pk[pk] for pk in pks if pk in by_pk],
                                   best=services.best_trial(study), trial_counts=services.counts(study.id))
        body["nextPageToken"] = token
        return Response(body)


class StopStudyView(BearerView):
    http_method_names = ["post"]

    def post(self, request: Request, xid: int, study_id: int) -> Response:
        reads.experiment(int(xid), request.user.identity, Role.WRITER)
        study = services.stop_study(int(xid), int(study_id))
        return Response(services.study_json(study, best=services.best_trial(study),
                                            trial_counts=services.counts(study.id)))


names.register_converters()  # <id:...>: ids spelled once (core.names.IdConverter)
urlpatterns: list[URLPattern] = [
    path("v1/experiments/<id:xid>/studies", StudiesView.as_view(), name="rest-studies"),
    path("v1/experiments/<id:xid>/studies/<id:study_id>", StudyView.as_view(), name="rest-study"),
    path("v1/experiments/<id:xid>/studies/<id:study_id>:stop", StopStudyView.as_view(), name="rest-study-stop"),
]


def openapi_paths() -> dict[str, Any]:
    """These endpoints in the OpenAPI document (merged by `xmc.api.openapi.build_document`)."""
    error = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    xid = {"name": "xid", "in": "path", "required": True, "schema": {"type": "string"}, "description": "experiment id"}
    study_id = {"name": "study_id", "in": "path", "required": True, "schema": {"type": "string"},
                "description": "study id"}
    page = [{"name": "pageSize", "in": "query", "required": False, "schema": {"type": "integer"},
             "description": "at most 1000 (0: 100)"},
            {"name": "pageToken", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "from the previous page's nextPageToken"}]
    obj = {"type": "object"}
    study = {"description": "a study", "content": {"application/json": {"schema": obj}}}
    errors = {"400": error, "401": error, "403": error, "404": error, "429": error}
    common = {"x-not-an-rpc": True, "tags": ["experiments"]}
    request_body = {"required": True, "content": {"application/json": {"schema": obj, "example": {
        "templateWorkUnit": 1,
        "parameters": {"lr": {"logUniform": [1e-5, 1e-1]}, "batch_size": {"choice": [32, 64, 128]},
                       "dropout": {"uniform": [0, 0.5]}, "layers": {"int": [2, 8]}},
        "objective": {"metric": "loss", "stat": "last", "goal": "MINIMIZE"},
        "maxTrials": 40, "parallelTrials": 4, "sampler": "tpe", "pruner": {"median": {"warmupSteps": 5}}}}}}
    base = "/v1/experiments/{xid}/studies"
    return {
        base: {
            "post": {**common, "operationId": "CreateStudy", "x-path-template": base,
                     "summary": "Start a hyperparameter search over clones of a work unit (docs/architecture/studies.md)",
                     "parameters": [xid], "requestBody": request_body, "responses": {"200": study, **errors}},
            "get": {**common, "operationId": "ListStudies", "x-path-template": base,
                    "summary": "The experiment's studies, newest first", "parameters": [xid, *page],
                    "responses": {"200": {"description": "a page of studies", "content": {"application/json": {
                        "schema": {"type": "object", "properties": {"studies": {"type": "array", "items": obj},
                                                                     "nextPageToken": {"type": "string"}}}}}},
                        **errors}},
        },
        base + "/{study_id}": {"get": {
            **common, "operationId": "GetStudy", "x-path-template": base + "/{study_id}",
            "summary": "A study: state, a page of its trials, their counts and the best trial",
            "parameters": [xid, study_id, *page], "responses": {"200": study, **errors}}},
        base + "/{study_id}:stop": {"post": {
            **common, "operationId": "StopStudy", "x-path-template": base + "/{study_id}:stop",
            "summary": "Stop a study: its running trials are stopped, it ends STOPPED",
            "parameters": [xid, study_id], "responses": {"200": study, **errors}}},
    }
