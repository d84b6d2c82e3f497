"""The OpenAPI 3 document of the REST API and its browsable page, generated, never hand-written.

Who calls it: ``xmc.api.rest_urls`` serves `xmc.api.openapi.openapi_json` at
``GET /v1/openapi.json`` and `xmc.api.openapi.docs_page` at ``GET /v1/docs``.

Paths come from the binding table `xmc.api.rest.BINDINGS` (each template's
variables split into one path parameter per ``*``: ``/v1/experiments/{xid}``);
schemas come from the protobuf descriptors of the request and response
messages, in their proto3 JSON form: lowerCamelCase property names, enums as
string enums, 64-bit integers as strings, repeated fields as arrays, maps as
objects, well-known types (Timestamp, FieldMask, Any, ...) as their JSON
spellings, and nested messages as ``$ref`` to ``components/schemas/<full
proto name>``. Fields marked ``OUTPUT_ONLY`` in the protos are ``readOnly``.
"""
from __future__ import annotations

import secrets
from functools import lru_cache
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from google.api import field_behavior_pb2
from google.protobuf import descriptor
from google.protobuf.descriptor import FieldDescriptor

from xmc.api import extensions, headlines, importance, metrics_write, studies, sweeps
from xmc.api.rest import BINDINGS, HTTP_STATUS, Binding

OPENAPI_VERSION = "3.0.3"
SCHEMA_PREFIX = "#/components/schemas/"

_WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time",
                                  "description": "RFC 3339, e.g. 2026-01-02T03:04:05.678Z"},
    "google.protobuf.Duration": {"type": "string", "description": "seconds with an 's' suffix, e.g. 3.5s"},
    "google.protobuf.FieldMask": {"type": "string",
                                  "description": "comma-separated field paths, lowerCamelCase, e.g. title,tags"},
    "google.protobuf.Empty": {"type": "object", "properties": {}},
    "google.protobuf.Any": {"type": "object", "properties": {"@type": {"type": "string"}},
                            "additionalProperties": True,
                            "description": "a message of the type named by @type, its fields inline"},
    "google.protobuf.Struct": {"type": "object", "additionalProperties": True},
    "google.protobuf.Value": {"description": "any JSON value"},
    "google.protobuf.ListValue": {"type": "array", "items": {}},
    "google.protobuf.DoubleValue": {"type": "number", "format": "double", "nullable": True},
    "google.protobuf.FloatValue": {"type": "number", "format": "float", "nullable": True},
    "google.protobuf.Int64Value": {"type": "string", "format": "int64", "nullable": True},
    "google.protobuf.UInt64Value": {"type": "string", "format": "uint64", "nullable": True},
    "google.protobuf.Int32Value": {"type": "integer", "format": "int32", "nullable": True},
    "google.protobuf.UInt32Value": {"type": "integer", "minimum": 0, "nullable": True},
    "google.protobuf.BoolValue": {"type": "boolean", "nullable": True},
    "google.protobuf.StringValue": {"type": "string", "nullable": True},
    "google.protobuf.BytesValue": {"type": "string", "format": "byte", "nullable": True},
}

_SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_DOUBLE: {"type": "number", "format": "double"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number", "format": "float"},
    FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "minimum": 0},
    FieldDescriptor.TYPE_FIXED32: {"type": "integer", "minimum": 0},
    # proto3 JSON writes 64-bit integers as strings (and reads either form)
    FieldDescriptor.TYPE_INT64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_SINT64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_SFIXED64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_UINT64: {"type": "string", "format": "uint64"},
    FieldDescriptor.TYPE_FIXED64: {"type": "string", "format": "uint64"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "format": "byte"},
}

_TAGS = {
    "experiments": "Experiments",
    "workUnits": "Work units",
    "currentExecution": "Work units",
    "executions": "Work units",
    "artifacts": "Artifacts",
    "statusMessages": "Status messages",
    "operations": "Operations",
}

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "status", "message"],
            "properties": {
                "code": {"type": "integer", "description": "the HTTP status"},
                "status": {"type": "string", "enum": sorted(HTTP_STATUS), "description": "canonical gRPC code"},
                "message": {"type": "string"},
                "details": {"type": "array", "items": {"type": "object", "additionalProperties": True},
                            "description": "google.rpc.BadRequest naming the field at fault, when there is one"},
            },
        }
    },
}


class SchemaBuilder:
    """Walks message descriptors into ``components/schemas`` (each message and enum once, by full name)."""

    def __init__(self) -> None:
        self.schemas: dict[str, dict[str, Any]] = {}

    def message(self, desc: descriptor.Descriptor) -> dict[str, Any]:
        """A schema (inline for well-known types, else a ``$ref``) for a message type."""
        name = desc.full_name
        if name in _WELL_KNOWN:
            return dict(_WELL_KNOWN[name])
        ref = {"$ref": SCHEMA_PREFIX + name}
        if name in self.schemas:
            return ref
        self.schemas[name] = {}  # placeholder: recursive messages end here
        properties = {f.json_name: self.field(f) for f in desc.fields}
        schema: dict[str, Any] = {"type": "object", "properties": properties,
                                  "description": f"`{name}` in proto3 JSON form"}
        oneofs = [o for o in desc.oneofs if not _synthetic(o)]
        if oneofs:
            schema["description"] += ". " + " ".join(
                f"At most one of {', '.join(f.json_name for f in o.fields)} (oneof {o.name})." for o in oneofs
            )
        self.schemas[name] = schema
        return ref

    def enum(self, desc: descriptor.EnumDescriptor) -> dict[str, Any]:
        name = desc.full_name
        if name not in self.schemas:
            self.schemas[name] = {"type": "string", "enum": [v.name for v in desc.values],
                                  "description": f"enum `{name}`, by name"}
        return {"$ref": SCHEMA_PREFIX + name}

    def field(self, fd: FieldDescriptor) -> dict[str, Any]:
        if fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
            value = fd.message_type.fields_by_name["value"]
            return {"type": "object", "additionalProperties": self.single(value)}
        schema = self.single(fd)
        if fd.is_repeated:
            schema = {"type": "array", "items": schema}
        behaviors = set(fd.GetOptions().Extensions[field_behavior_pb2.field_behavior])
        if field_behavior_pb2.OUTPUT_ONLY in behaviors:
            schema = {"allOf": [schema], "readOnly": True} if "$ref" in schema else {**schema, "readOnly": True}
        return schema

    def single(self, fd: FieldDescriptor) -> dict[str, Any]:
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            return self.message(fd.message_type)
        if fd.type == FieldDescriptor.TYPE_ENUM:
            return self.enum(fd.enum_type)
        return dict(_SCALARS[fd.type])


def _synthetic(oneof: descriptor.OneofDescriptor) -> bool:
    """The hidden oneof of a proto3 ``optional`` field."""
    return len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name


def _tag(openapi_path: str) -> str:
    segments = [s.split(":")[0] for s in openapi_path.split("/") if s and not s.startswith("{")]
    for segment in reversed(segments):
        if segment in _TAGS:
            return _TAGS[segment]
    return "Other"


def _query_parameters(binding: Binding, schemas: SchemaBuilder) -> list[dict[str, Any]]:
    """Top-level request fields not bound by path or body, settable as ``?field=value``."""
    params = []
    for fd in binding.request_class.DESCRIPTOR.fields:
        if fd.name in binding.bound_fields:
            continue
        is_message = fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.full_name not in _WELL_KNOWN
        if is_message:
            continue  # nested fields can be set as a.b=value, but are not listed
        described = f"`{fd.name}` of `{binding.request_class.DESCRIPTOR.full_name}`; `{fd.name}` is accepted too"
        params.append({"name": fd.json_name, "in": "query", "required": False,
                       "description": described, "schema": schemas.field(fd)})
    return params


def _operation(binding: Binding, operation_id: str, schemas: SchemaBuilder) -> dict[str, Any]:
    request_desc = binding.request_class.DESCRIPTOR
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "description": description, "schema": {"type": "string"}}
        for name, description in binding.path.openapi_parameters
    ]
    parameters.extend(_query_parameters(binding, schemas))
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": binding.rpc,
        "description": (f"`{binding.service}.{binding.rpc}` over HTTP: `{binding.http_method} {binding.template}`"
                        + (f", body `{binding.body}`" if binding.body else "") + "."),
        "tags": [_tag(binding.path.openapi_path)],
        "x-grpc-method": f"/{binding.service}/{binding.rpc}",
        "x-path-template": binding.template,
        "parameters": parameters,
        "responses": {
            "200": {"description": f"`{binding.response_class.DESCRIPTOR.full_name}`",
                    "content": {"application/json": {"schema": schemas.message(binding.response_class.DESCRIPTOR)}}},
            "default": {"description": "an error", "content": {"application/json": {
                "schema": {"$ref": SCHEMA_PREFIX + "Error"}}}},
        },
    }
    if binding.body:
        path_fields = {v.field_path.split(".")[-1] for v in binding.path.variables}
        if binding.body == "*":
            body_desc = request_desc
            what = f"the whole `{request_desc.full_name}`; path variables override its fields"
        else:
            body_desc = request_desc.fields_by_name[binding.body].message_type
            what = f"`{request_desc.full_name}.{binding.body}`"
        media = {"schema": schemas.message(body_desc), "example": body_example(body_desc, skip=path_fields)}
        operation["requestBody"] = {"required": binding.body != "*", "description": what,
                                    "content": {"application/json": media}}
    return operation


def body_example(desc: descriptor.Descriptor, *, skip: set[str]) -> dict[str, Any]:
    """A starting point for a request body: the settable top-level scalar fields with neutral values.

    Output-only fields, resource names, fields the path sets, and nested
    messages are left out (the docs page pre-fills its body box with this).
    """
    example: dict[str, Any] = {}
    for fd in desc.fields:
        behaviors = set(fd.GetOptions().Extensions[field_behavior_pb2.field_behavior])
        if (fd.name in skip or fd.name == "name" or field_behavior_pb2.OUTPUT_ONLY in behaviors
                or fd.type == FieldDescriptor.TYPE_MESSAGE):
            continue
        if fd.is_repeated:
            value: Any = []
        elif fd.type == FieldDescriptor.TYPE_ENUM:
            value = next((v.name for v in fd.enum_type.values if v.number != 0), fd.enum_type.values[0].name)
        elif fd.type == FieldDescriptor.TYPE_BOOL:
            value = False
        elif _SCALARS[fd.type]["type"] == "string" and _SCALARS[fd.type].get("format") in ("int64", "uint64"):
            value = "0"
        elif _SCALARS[fd.type]["type"] in ("integer", "number"):
            value = 0
        else:
            value = ""
        example[fd.json_name] = value
    return example


def build_document() -> dict[str, Any]:
    """The OpenAPI 3 document for every binding in `xmc.api.rest.BINDINGS`."""
    schemas = SchemaBuilder()
    paths: dict[str, dict[str, Any]] = {}
    seen_ids: dict[str, int] = {}
    for binding in BINDINGS:
        count = seen_ids[binding.rpc] = seen_ids.get(binding.rpc, 0) + 1
        operation_id = binding.rpc if count == 1 else f"{binding.rpc}{count}"
        item = paths.setdefault(binding.path.openapi_path, {})
        item[binding.http_method.lower()] = _operation(binding, operation_id, schemas)
    paths.update(metrics_write.openapi_paths())  # not an RPC: jobs write points with their own token
    paths.update(sweeps.openapi_paths())  # not RPCs: the sweep read and parameter importance
    paths.update(importance.openapi_paths())
    paths.update(headlines.openapi_paths())  # not an RPC: each unit's sentence and reason (workunits.headline)
    paths.update(studies.openapi_paths())
    for extra in extensions.openapi_paths:  # endpoints that are not RPCs (e.g. streamed logs)
        paths.update(extra())
    components_schemas = {"Error": ERROR_SCHEMA, **dict(sorted(schemas.schemas.items()))}
    tags = sorted({op["tags"][0] for item in paths.values() for op in item.values()})
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "XMC Experiment State Service and Dashboard Service (cloud.xmanager.v1) over HTTP/JSON",
            "version": "v1",
            "description": (
                "The gRPC APIs `cloud.xmanager.v1.ExperimentStateService`, `cloud.xmanager.v1.DashboardService` and `google.longrunning.Operations` at "
                "the protos' HTTP bindings. Bodies are proto3 JSON (lowerCamelCase names, enums by name, int64 as "
                "strings). Query parameters take the lowerCamelCase or the original field name. Errors are "
                "`{\"error\": {\"code\", \"status\", \"message\"}}`. Authenticate with `Authorization: Bearer "
                "<token>` (from `xmanager login` or `manage.py issue_token EMAIL`)."
            ),
        },
        "servers": [{"url": "/"}],
        "tags": [{"name": t} for t in tags],
        "paths": paths,
        "components": {
            "schemas": components_schemas,
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
        "security": [{"bearerAuth": []}],
    }


@lru_cache(maxsize=1)
def document() -> dict[str, Any]:
    """`build_document`, built once per process (the table and descriptors never change at run time)."""
    return build_document()


@require_GET
def openapi_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document())


#: The API browser's policy: its one inline script and style run by this response's nonce; nothing
#: else (no injected script or style, no other origin, no framing). ``{nonce}`` is filled per response.
DOCS_CSP = ("default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@require_GET
def docs_page(request: HttpRequest) -> HttpResponse:
    """A self-contained page (no external assets) listing every operation with a try-it form.

    It holds a pasted bearer token (in ``sessionStorage``), so it has a strict Content-Security-Policy
    (`DOCS_CSP`, a fresh nonce per response): an injection into it could run no script."""
    nonce = secrets.token_urlsafe(18)
    response = render(request, "api/docs.html", {"spec_url": "openapi.json", "csp_nonce": nonce})
    response["Content-Security-Policy"] = DOCS_CSP.format(nonce=nonce)
    response["Referrer-Policy"] = "no-referrer"
    return response
