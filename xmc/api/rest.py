"""REST transcoding: the proto's HTTP bindings served by DRF over the same RPC table as gRPC.

Who calls it: ``xmc.api.rest_urls`` mounts `xmc.api.rest.urlpatterns` under
the site root; `xmc.api.openapi` documents `xmc.api.rest.BINDINGS`.

One table, `xmc.api.rest.BINDINGS`, lists every HTTP binding: the HTTP
method, the path template exactly as written in the proto's ``google.api.http``
options (``/v1/{name=experiments/*}:updateLaunchState``), the RPC, and the body
field. Each path template becomes one ``re_path``; one generic view,
`xmc.api.rest.RpcView`, serves every binding that shares the path and picks
the binding by HTTP method. Per request it:

1. authenticates the bearer token and meters the per-identity rate limit
   (`xmc.auth.drf.BearerAuthentication`, `xmc.auth.drf.IdentityRateThrottle`);
2. builds the request message as grpc-gateway does: the JSON body into the
   body field (or the whole request for ``*``), then query parameters into the
   remaining fields (lowerCamelCase or original names, dotted for nested
   fields), then the path variables, which win; a PATCH without
   ``updateMask`` gets the mask its body implies (AIP-134);
3. calls `xmc.api.registry.invoke` -- the same handler the gRPC server runs;
4. answers the response message as proto3 JSON (lowerCamelCase, enums by
   name, int64 as strings), so ``json_format.Parse`` gives back the message.

Errors of every kind -- ``ServiceError`` from a handler, a bad body or query
parameter, DRF's own 401/403/405/429, an unexpected exception -- leave through
`xmc.api.rest.rest_exception_handler` as ``{"error": {"code", "status",
"message"}}`` with the canonical gRPC-to-HTTP mapping.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.urls import URLPattern, re_path
from google.protobuf import descriptor, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rest_framework import exceptions
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView, set_rollback

from core import inputs, pb
from core.errors import InvalidArgument, ServiceError
from xmc.api import registry
from xmc.api.registry import DASHBOARDS, ESS, OPERATIONS, Caller
from xmc.auth.drf import BearerAuthentication, IdentityRateThrottle, IdentityUser
from xmc.ops import observe_rpc

logger = logging.getLogger(__name__)


# --- The binding table ---------------------------------------------------------------


@dataclass(frozen=True)
class Binding:
    """One HTTP binding of one RPC, as in the proto's ``google.api.http`` option.

    ``body`` is ``""`` (no body), ``"*"`` (the whole request message) or the
    name of one top-level message field of the request.
    """

    http_method: str
    template: str
    service: str
    rpc: str
    body: str = ""

    @cached_property
    def method_descriptor(self) -> descriptor.MethodDescriptor:
        return _SERVICES[self.service].methods_by_name[self.rpc]

    @cached_property
    def request_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.method_descriptor.input_type)

    @cached_property
    def response_class(self) -> type[Message]:
        return message_factory.GetMessageClass(self.method_descriptor.output_type)

    @cached_property
    def path(self) -> PathTemplate:
        return PathTemplate.parse(self.template)

    @cached_property
    def bound_fields(self) -> frozenset[str]:
        """Top-level request fields set by the path or the body (not settable by query)."""
        names = {variable.field_path.split(".")[0] for variable in self.path.variables}
        if self.body == "*":
            names.update(f.name for f in self.request_class.DESCRIPTOR.fields)
        elif self.body:
            names.add(self.body)
        return frozenset(names)

    @cached_property
    def infers_update_mask(self) -> bool:
        """A PATCH of one resource field next to an ``update_mask`` (``Update*`` RPCs)."""
        fields = self.request_class.DESCRIPTOR.fields_by_name
        return (self.http_method == "PATCH" and self.body not in ("", "*") and "update_mask" in fields
                and _is_field_mask(fields["update_mask"]))

    @property
    def label(self) -> str:
        return f"{self.http_method} {self.template}"


_SERVICES: dict[str, descriptor.ServiceDescriptor] = {
    ESS: pb.api.DESCRIPTOR.services_by_name["ExperimentStateService"],
    OPERATIONS: pb.longrunning.DESCRIPTOR.services_by_name["Operations"],
    DASHBOARDS: pb.dashboard_api.DESCRIPTOR.services_by_name["DashboardService"],
}

_E = "/v1/{name=experiments/*}"
_WU = "/v1/{name=experiments/*/workUnits/*}"
_WU_PARENT = "/v1/{parent=experiments/*/workUnits/*}"
_E_PARENT = "/v1/{parent=experiments/*}"

#: Every HTTP binding we serve. The ExperimentStateService and DashboardService
#: rows are exactly the ``google.api.http`` options of ``cloud.xmanager.v1`` (a
#: test compares them with the descriptors). The google.longrunning rows adapt that service's own
#: bindings (``/v1/{name=operations/**}``) to our operation names, which live
#: under experiments: ``/v1/operations/{name}`` takes the full name after the
#: prefix, and the operation's own resource path works too.
BINDINGS: tuple[Binding, ...] = (
    Binding("POST", "/v1/experiments", ESS, "CreateExperiment", body="experiment"),
    Binding("POST", _E + ":updateLaunchState", ESS, "UpdateExperimentLaunchState", body="*"),
    Binding("GET", _E, ESS, "GetExperiment"),
    Binding("GET", _E + "/status", ESS, "GetExperimentStatus"),
    Binding("GET", "/v1/experiments", ESS, "ListExperiments"),
    Binding("GET", "/v1/experiments:search", ESS, "SearchExperiments"),
    Binding("PATCH", "/v1/{experiment.name=experiments/*}", ESS, "UpdateExperiment", body="experiment"),
    Binding("POST", _E_PARENT + "/workUnits", ESS, "CreateWorkUnit", body="work_unit"),
    Binding("GET", _WU, ESS, "GetWorkUnit"),
    Binding("GET", _WU + "/currentExecution", ESS, "GetCurrentWorkUnitExecution"),
    Binding("GET", _WU_PARENT + "/executions", ESS, "ListWorkUnitExecutions"),
    Binding("GET", _E_PARENT + "/workUnits", ESS, "ListWorkUnits"),
    Binding("GET", _E_PARENT + "/workUnits:search", ESS, "SearchWorkUnits"),
    Binding("POST", _WU + ":stop", ESS, "StopWorkUnit", body="*"),
    Binding("POST", _E_PARENT + "/workUnits:batchStop", ESS, "BatchStopWorkUnits", body="*"),
    Binding("POST", _WU + ":restart", ESS, "RestartWorkUnit", body="*"),
    Binding("POST", _E_PARENT + "/workUnits:batchRestart", ESS, "BatchRestartWorkUnits", body="*"),
    Binding("PATCH", "/v1/{work_unit.name=experiments/*/workUnits/*}", ESS, "UpdateWorkUnit", body="work_unit"),
    Binding("POST", _E_PARENT + "/artifacts", ESS, "CreateArtifact", body="artifact"),
    Binding("POST", _WU_PARENT + "/artifacts", ESS, "CreateArtifact", body="artifact"),
    Binding("GET", "/v1/{name=artifacts/*}", ESS, "GetArtifact"),
    Binding("GET", "/v1/artifacts", ESS, "ListArtifacts"),
    Binding("GET", _E_PARENT + "/artifacts", ESS, "ListArtifacts"),
    Binding("GET", _WU_PARENT + "/artifacts", ESS, "ListArtifacts"),
    Binding("GET", "/v1/artifacts:search", ESS, "SearchArtifacts"),
    Binding("GET", _E_PARENT + "/artifacts:search", ESS, "SearchArtifacts"),
    Binding("GET", _WU_PARENT + "/artifacts:search", ESS, "SearchArtifacts"),
    Binding("DELETE", "/v1/{name=artifacts/*}", ESS, "DeleteArtifact"),
    Binding("PATCH", "/v1/{artifact.name=artifacts/*}", ESS, "UpdateArtifact", body="artifact"),
    Binding("GET", _E_PARENT + "/statusMessages", ESS, "ListStatusMessages"),
    Binding("GET", _WU_PARENT + "/statusMessages", ESS, "ListStatusMessages"),
    Binding("GET", _E_PARENT + "/statusMessages:search", ESS, "SearchStatusMessages"),
    Binding("GET", _WU_PARENT + "/statusMessages:search", ESS, "SearchStatusMessages"),
    # google.longrunning.Operations
    Binding("GET", "/v1/operations/{name=**}", OPERATIONS, "GetOperation"),
    Binding("GET", "/v1/{name=experiments/*/operations/*}", OPERATIONS, "GetOperation"),
    Binding("GET", "/v1/{name=experiments/*/workUnits/*/operations/*}", OPERATIONS, "GetOperation"),
    Binding("GET", "/v1/{name=experiments/*/operations}", OPERATIONS, "ListOperations"),
    Binding("GET", "/v1/{name=experiments/*/workUnits/*/operations}", OPERATIONS, "ListOperations"),
    Binding("POST", "/v1/operations/{name=**}:cancel", OPERATIONS, "CancelOperation", body="*"),
    Binding("DELETE", "/v1/operations/{name=**}", OPERATIONS, "DeleteOperation"),
    # cloud.xmanager.v1.DashboardService: exactly its google.api.http options, additional bindings included.
    Binding("POST", "/v1/dashboards", DASHBOARDS, "CreateDashboard", body="*"),
    Binding("GET", "/v1/{name=dashboards/*}", DASHBOARDS, "GetDashboard"),
    Binding("GET", "/v1/dashboards", DASHBOARDS, "ListDashboards"),
    Binding("PATCH", "/v1/{dashboard.name=dashboards/*}", DASHBOARDS, "UpdateDashboard", body="dashboard"),
    Binding("DELETE", "/v1/{name=dashboards/*}", DASHBOARDS, "DeleteDashboard"),
    Binding("POST", _WU_PARENT + "/charts", DASHBOARDS, "CreateChart", body="chart"),
    Binding("GET", "/v1/{name=charts/*}", DASHBOARDS, "GetChart"),
    Binding("GET", "/v1/{name=experiments/*/workUnits/*/charts/*}:getData", DASHBOARDS, "GetChartData"),
    Binding("GET", "/v1/{name=charts/*}:getData", DASHBOARDS, "GetChartData"),
    Binding("GET", "/v1/{name=dashboards/*/charts/*}:getData", DASHBOARDS, "GetChartData"),
    Binding("GET", "/v1/{parent=dashboards/*}/charts", DASHBOARDS, "ListCharts"),
    Binding("GET", _WU_PARENT + "/charts", DASHBOARDS, "ListCharts"),
    Binding("PATCH", "/v1/{chart.name=experiments/*/workUnits/*/charts/*}", DASHBOARDS, "UpdateChart", body="chart"),
    Binding("PATCH", "/v1/{chart.name=charts/*}", DASHBOARDS, "UpdateChart", body="chart"),
    Binding("PATCH", "/v1/{chart.name=dashboards/*/charts/*}", DASHBOARDS, "UpdateChart", body="chart"),
    Binding("DELETE", "/v1/{name=experiments/*/workUnits/*/charts/*}", DASHBOARDS, "DeleteChart"),
    Binding("DELETE", "/v1/{name=charts/*}", DASHBOARDS, "DeleteChart"),
    Binding("DELETE", "/v1/{name=dashboards/*/charts/*}", DASHBOARDS, "DeleteChart"),
)


# --- Path templates --------------------------------------------------------------------

#: The OpenAPI parameter name for the id after each collection segment.
ID_PARAMETERS = {
    "experiments": "xid",
    "workUnits": "wid",
    "executions": "eid",
    "artifacts": "aid",
    "operations": "operationId",
    "statusMessages": "statusMessageId",
    "dashboards": "dashboardId",
    "charts": "chartId",
}

_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)(?:=([^}]*))?\}")
# A ``*`` matches one path segment. Segments never contain ':' here, so a
# custom verb (``:stop``) can never be swallowed into a name: our ids are
# integers, and ``/v1/experiments/1:stop`` must not match GetExperiment.
_SEGMENT_RE = r"[^/:]+"
_MULTI_SEGMENT_RE = r"[^:]+"


@dataclass(frozen=True)
class PathVariable:
    field_path: str  # request field, dotted: "name", "experiment.name"
    pattern: str  # the segments it matches: "experiments/*", "**"
    group: str  # the regex group name: "p0", "p1", ...


@dataclass(frozen=True)
class PathTemplate:
    """A parsed ``google.api.http`` path template (``/v1/{name=experiments/*}:stop``)."""

    template: str
    regex: str  # for re_path: no leading slash, anchored
    variables: tuple[PathVariable, ...]
    openapi_path: str  # "/v1/experiments/{xid}:stop"
    openapi_parameters: tuple[tuple[str, str], ...] = field(default=())  # (name, description)

    @classmethod
    def parse(cls, template: str) -> PathTemplate:
        if not template.startswith("/"):
            raise ValueError(f"path template must start with '/': {template!r}")
        regex: list[str] = ["^"]
        openapi: list[str] = []
        variables: list[PathVariable] = []
        params: list[tuple[str, str]] = []
        position = 1  # skip the leading slash: Django matches paths without it
        for match in _VARIABLE.finditer(template):
            literal = template[position:match.start()]
            _reject_wildcards(literal, template)
            regex.append(re.escape(literal))
            openapi.append(literal)
            field_path, pattern = match.group(1), match.group(2) or "*"
            group = f"p{len(variables)}"
            variables.append(PathVariable(field_path, pattern, group))
            regex.append(f"(?P<{group}>{_pattern_regex(pattern, template)})")
            piece, piece_params = _pattern_openapi(field_path, pattern, previous=openapi)
            openapi.append(piece)
            params.extend(piece_params)
            position = match.end()
        literal = template[position:]
        _reject_wildcards(literal, template)
        regex.append(re.escape(literal) + "$")
        openapi.append(literal)
        return cls(template, "".join(regex), tuple(variables), "/" + "".join(openapi), tuple(params))


def _reject_wildcards(literal: str, template: str) -> None:
    if "*" in literal or "{" in literal or "}" in literal:
        raise ValueError(f"unsupported path template {template!r}: wildcards only inside {{variables}}")


def _pattern_regex(pattern: str, template: str) -> str:
    parts = []
    for segment in pattern.split("/"):
        if segment == "*":
            parts.append(_SEGMENT_RE)
        elif segment == "**":
            parts.append(_MULTI_SEGMENT_RE)
        elif not segment or "*" in segment:
            raise ValueError(f"unsupported segment {segment!r} in path template {template!r}")
        else:
            parts.append(re.escape(segment))
    return "/".join(parts)


def _pattern_openapi(field_path: str, pattern: str, *, previous: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """``experiments/*/workUnits/*`` -> ``experiments/{xid}/workUnits/{wid}`` and its parameters."""
    pieces: list[str] = []
    params: list[tuple[str, str]] = []
    before = "".join(previous).rstrip("/").rsplit("/", 1)[-1]
    for segment in pattern.split("/"):
        if segment == "*":
            name = ID_PARAMETERS.get(before, f"{before or 'segment'}Id")
            params.append((name, f"one path segment of `{field_path}` (the id after `{before}/`)"))
            pieces.append(f"{{{name}}}")
        elif segment == "**":
            name = _json_name(field_path.rsplit(".", 1)[-1])
            params.append((name, f"the whole `{field_path}`; may contain '/' (send it unescaped)"))
            pieces.append(f"{{{name}}}")
        else:
            pieces.append(segment)
        before = segment
    return "/".join(pieces), params


def _json_name(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# --- Building the request message ---------------------------------------------------------


def build_request(binding: Binding, *, path_values: Mapping[str, str], query: Mapping[str, Sequence[str]],
                  body: bytes) -> Message:
    """The request message of one HTTP call: body, then query parameters, then path variables."""
    message = binding.request_class()
    data: dict[str, Any] = {}
    if binding.body:
        data = _parse_json_body(body, "" if binding.body == "*" else binding.body)
        target = message if binding.body == "*" else getattr(message, binding.body)
        try:
            json_format.ParseDict(data, target)
        except json_format.ParseError as exc:
            where = "request body" if binding.body == "*" else f"body field {binding.body!r}"
            raise InvalidArgument(f"invalid {where}: {exc}", field=None if binding.body == "*" else binding.body) from None
    for key, values in query.items():
        _apply_query_parameter(message, key, values, bound=binding.bound_fields)
    if binding.infers_update_mask and not message.update_mask.paths:
        message.update_mask.paths.extend(_implied_mask(binding, data))
    for variable in binding.path.variables:
        _set_path_field(message, variable.field_path, path_values[variable.group])
    return message


def _implied_mask(binding: Binding, data: Mapping[str, Any]) -> list[str]:
    """The update mask a PATCH without ``updateMask`` implies: the body's top-level fields but the name.

    AIP-134: an omitted mask means "the fields the client sent". Top-level
    paths only, because our Update RPCs replace nested and repeated fields
    whole; the handler still refuses paths that are not updatable.
    """
    body_type = binding.request_class.DESCRIPTOR.fields_by_name[binding.body].message_type
    paths = []
    for key in data:
        fd = _find_field(body_type, key)
        if fd is not None and fd.name != "name":
            paths.append(fd.name)
    return paths


def _parse_json_body(body: bytes, root: str) -> dict[str, Any]:
    data = inputs.parse_json(body, root=root)  # bounded depth and integers; no NUL or lone surrogates
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _set_path_field(message: Message, field_path: str, value: str) -> None:
    *parents, leaf = field_path.split(".")
    for name in parents:
        message = getattr(message, name)
    setattr(message, leaf, value)


def _find_field(message_descriptor: descriptor.Descriptor, name: str) -> FieldDescriptor | None:
    """A field by its original name (``page_size``) or proto3 JSON name (``pageSize``)."""
    found = message_descriptor.fields_by_name.get(name)
    if found is not None:
        return found
    for candidate in message_descriptor.fields:
        if candidate.json_name == name:
            return candidate
    return None


def _apply_query_parameter(message: Message, key: str, values: Sequence[str], *, bound: frozenset[str]) -> None:
    """Set the field named by a query parameter (``pageSize``, ``page_size``, ``a.b``) from its values."""
    names = key.split(".")
    target = message
    path: list[str] = []
    for position, name in enumerate(names):
        fd = _find_field(target.DESCRIPTOR, name)
        if fd is None:
            raise InvalidArgument(f"unknown query parameter {key!r}: {target.DESCRIPTOR.full_name} has no field "
                                  f"{name!r}", field=key)
        path.append(fd.name)
        if position == 0 and fd.name in bound:
            raise InvalidArgument(f"query parameter {key!r} cannot be used here: the field {fd.name!r} is set by "
                                  "the path or the request body", field=key)
        last = position == len(names) - 1
        if fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.full_name not in _WELL_KNOWN_SCALARS:
            if last or _is_repeated(fd):
                raise InvalidArgument(f"query parameter {key!r} names a message; name one of its scalar fields "
                                      "(e.g. a.b=value)", field=key)
            target = getattr(target, fd.name)
            continue
        if not last:
            raise InvalidArgument(f"unknown query parameter {key!r}: {fd.name!r} has no sub-fields", field=key)
        dotted = ".".join(path)
        if _is_repeated(fd):
            container = getattr(target, fd.name)
            for value in values:
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    container.add().CopyFrom(_well_known_value(fd, key, value))
                else:
                    container.append(_scalar_value(fd, key, value))
            return
        if len(values) != 1 and not _is_field_mask(fd):
            raise InvalidArgument(f"query parameter {key!r} given {len(values)} times; it takes one value",
                                  field=dotted)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(target, fd.name).CopyFrom(_well_known_values(fd, key, values))
        else:
            setattr(target, fd.name, _scalar_value(fd, key, values[0]))


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


def _is_field_mask(fd: FieldDescriptor) -> bool:
    return fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.full_name == "google.protobuf.FieldMask"


_WELL_KNOWN_SCALARS = {
    "google.protobuf.FieldMask",
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
    "google.protobuf.DoubleValue",
    "google.protobuf.FloatValue",
    "google.protobuf.Int64Value",
    "google.protobuf.UInt64Value",
    "google.protobuf.Int32Value",
    "google.protobuf.UInt32Value",
    "google.protobuf.BoolValue",
    "google.protobuf.StringValue",
    "google.protobuf.BytesValue",
}

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _bad_value(key: str, value: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"invalid value {value!r} for query parameter {key!r}: {why}", field=key)


def _scalar_value(fd: FieldDescriptor, key: str, value: str) -> Any:
    kind = fd.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        try:
            number = int(value.strip(), 10)
        except ValueError:
            raise _bad_value(key, value, "expected an integer") from None
        if not low <= number <= high:
            raise _bad_value(key, value, f"out of range [{low}, {high}]")
        return number
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        try:
            return float(value)
        except ValueError:
            raise _bad_value(key, value, "expected a number") from None
    if kind == FieldDescriptor.TYPE_BOOL:
        lowered = value.strip().lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
        raise _bad_value(key, value, "expected true or false")
    if kind == FieldDescriptor.TYPE_ENUM:
        enum_value = fd.enum_type.values_by_name.get(value)
        if enum_value is not None:
            return enum_value.number
        by_number = int(value, 10) if re.fullmatch(r"-?[0-9]+", value) else None
        if by_number is None or by_number not in fd.enum_type.values_by_number:
            names = ", ".join(v.name for v in fd.enum_type.values)
            raise _bad_value(key, value, f"expected one of {names}")
        return by_number
    if kind == FieldDescriptor.TYPE_BYTES:
        try:
            padded = value + "=" * (-len(value) % 4)
            return base64.urlsafe_b64decode(padded.replace("+", "-").replace("/", "_"))
        except (binascii.Error, ValueError):
            raise _bad_value(key, value, "expected base64") from None
    return value


def _well_known_value(fd: FieldDescriptor, key: str, value: str) -> Message:
    return _well_known_values(fd, key, [value])


def _well_known_values(fd: FieldDescriptor, key: str, values: Sequence[str]) -> Message:
    result = message_factory.GetMessageClass(fd.message_type)()
    name = fd.message_type.full_name
    if name == "google.protobuf.FieldMask":
        result.paths.extend(parse_field_mask(values))
        return result
    if name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        try:
            result.FromJsonString(values[0])
        except ValueError as exc:
            raise _bad_value(key, values[0], str(exc)) from None
        return result
    value_field = result.DESCRIPTOR.fields_by_name["value"]
    result.value = _scalar_value(value_field, key, values[0])
    return result


_CAMEL_HUMP = re.compile(r"(?<!^)([A-Z])")


def parse_field_mask(values: Sequence[str]) -> list[str]:
    """FieldMask paths from query values: proto3 JSON form or original names, comma-separated.

    ``updateMask=title,status.launchState`` and ``update_mask=title,status.launch_state``
    both give ``["title", "status.launch_state"]``; the parameter may repeat.
    """
    paths: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if item:
                paths.append(".".join(_CAMEL_HUMP.sub(r"_\1", part).lower() for part in item.split(".")))
    return paths


def parse_alt(query: dict[str, list[str]]) -> bool:
    """Remove Google's system parameter ``$alt`` (or ``alt``) from ``query``; True for integer enums.

    Google's generated REST clients send ``$alt=json;enum-encoding=int`` on
    every call; plain ``json`` is the default. Any other format is refused.
    """
    integer_enums = False
    for key in ("$alt", "alt"):
        for value in query.pop(key, []):
            media, *options = [part.strip() for part in value.split(";")]
            if media != "json" or any(o not in ("enum-encoding=int", "enum-encoding=string") for o in options):
                raise InvalidArgument(f"unsupported {key}={value!r}: only json (with enum-encoding=int) is served",
                                      field=key)
            integer_enums = integer_enums or "enum-encoding=int" in options
    return integer_enums


# --- Errors ------------------------------------------------------------------------------

#: Canonical gRPC code -> HTTP status (google/rpc/code.proto, as grpc-gateway maps it).
HTTP_STATUS = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}

#: DRF's own errors (raised before a handler runs) -> canonical code.
_DRF_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",  # as grpc-gateway: HTTP 405, status UNIMPLEMENTED
    406: "INVALID_ARGUMENT",
    413: "RESOURCE_EXHAUSTED",  # as gRPC answers a message over its size limit
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
}


class PayloadTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = "the request body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE allows"
    default_code = "payload_too_large"


def error_body(http_status: int, status: str, message: str, *, field: str | None = None) -> dict[str, Any]:
    """``{"error": {"code", "status", "message"[, "details"]}}``; ``details`` names the field at fault."""
    error: dict[str, Any] = {"code": http_status, "status": status, "message": message}
    if field:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": field, "description": message}],
            }
        ]
    return {"error": error}


def error_response(status: str, message: str, *, field: str | None = None,
                   headers: Mapping[str, str] | None = None, http_status: int | None = None) -> Response:
    code = http_status or HTTP_STATUS.get(status, 500)
    return Response(error_body(code, status, message, field=field), status=code, headers=dict(headers or {}))


def rest_exception_handler(exc: Exception, context: Mapping[str, Any]) -> Response:
    """DRF exception handler of the API views: every failure in the ``{"error": ...}`` shape."""
    set_rollback()
    if isinstance(exc, ServiceError):
        status = exc.code if exc.code in HTTP_STATUS else "UNKNOWN"
        return error_response(status, exc.message, field=exc.field)
    if isinstance(exc, exceptions.APIException):
        headers: dict[str, str] = {}
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            headers["WWW-Authenticate"] = auth_header
        wait = getattr(exc, "wait", None)
        if wait is not None:
            headers["Retry-After"] = str(max(1, math.ceil(wait)))
        if isinstance(exc, exceptions.NotAuthenticated):
            message = ("missing bearer token: send 'Authorization: Bearer <token>' "
                       "(get one with `xmanager login` or `manage.py issue_token`)")
        elif isinstance(exc, exceptions.Throttled):
            message = f"rate limit exceeded for this identity; retry after {headers.get('Retry-After', '1')} s"
        else:
            message = _detail_text(exc.detail)
        status = _DRF_STATUS.get(exc.status_code, "UNKNOWN")
        return error_response(status, message, headers=headers, http_status=exc.status_code)
    view = context.get("view")
    if isinstance(exc, (OperationalError, InterfaceError)):
        # The database went away or refused the connection: a retry may work.
        logger.warning("rest.database_unavailable", extra={"view": type(view).__name__ if view else None},
                       exc_info=True)
        _drop_broken_connections()
        return error_response("UNAVAILABLE", "database unavailable; retry later", headers={"Retry-After": "2"})
    logger.exception("rest.unhandled_error", extra={"view": type(view).__name__ if view else None})
    return error_response("INTERNAL", "internal error")


def _drop_broken_connections() -> None:
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        try:
            conn.close_if_unusable_or_obsolete()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail as well
            pass


def _detail_text(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(_detail_text(d) for d in detail)
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_detail_text(v)}" for k, v in detail.items())
    return str(detail)


# --- The views ---------------------------------------------------------------------------


class BearerView(APIView):
    """The one base of every REST view of the API (the bindings' `RpcView` and the hand-written ones:
    scheduling, subscriptions, logs, headlines, sweeps).

    Authentication, permission, throttle and exception handling are set here,
    not taken from ``REST_FRAMEWORK``, so the API behaves the same whatever
    the global DRF settings say. Only bearer authentication is used, so there
    is no session and no CSRF check. JSON out; no body parser (a view that
    takes a body parses it itself).
    """

    authentication_classes = (BearerAuthentication,)
    permission_classes: tuple[type, ...] = (IsAuthenticated,)
    throttle_classes = (IdentityRateThrottle,)
    renderer_classes = (JSONRenderer,)
    parser_classes = ()

    def get_exception_handler(self) -> Any:
        return rest_exception_handler


class RpcView(BearerView):
    """Serves the bindings of one path template, one per HTTP method (the body is parsed as
    proto3 JSON by build_request)."""

    routes: Mapping[str, Binding] = MappingProxyType({})  # per view, from as_view(routes=...)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        started = time.perf_counter()
        response = super().dispatch(request, *args, **kwargs)
        binding = self.routes.get(request.method or "")
        if binding is not None:
            observe_rpc("rest", binding.service, binding.rpc, _code_of(response), time.perf_counter() - started)
        return response

    def _serve(self, request: Request, groups: Mapping[str, str]) -> Response:
        binding = self.routes[request.method]
        user = request.user
        assert isinstance(user, IdentityUser)  # IsAuthenticated let only bearer identities through
        try:
            body = request.body
        except RequestDataTooBig:
            raise PayloadTooLarge() from None
        query = dict(request.query_params.lists())
        integer_enums = parse_alt(query)
        message = build_request(binding, path_values=groups, query=query, body=body)
        caller = Caller(identity=user.identity, asserted_email=request.headers.get("x-goog-user-email", ""))
        result = registry.invoke(binding.service, binding.rpc, message, caller)
        return Response(json_format.MessageToDict(result, use_integers_for_enums=integer_enums))

    def get(self, request: Request, **groups: str) -> Response:
        return self._serve(request, groups)

    post = patch = delete = get


def _code_of(response: HttpResponseBase) -> str:
    data = getattr(response, "data", None)
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("status", "UNKNOWN"))
    return "OK" if response.status_code < 400 else "UNKNOWN"


def routes() -> dict[str, dict[str, Binding]]:
    """Path regex -> HTTP method -> binding, in table order."""
    table: dict[str, dict[str, Binding]] = {}
    for binding in BINDINGS:
        methods = table.setdefault(binding.path.regex, {})
        if binding.http_method in methods:
            raise ValueError(f"two bindings for {binding.label}")
        methods[binding.http_method] = binding
    return table


def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any other ``/v1/...`` path: 404 in the API's error shape."""
    body = error_body(404, "NOT_FOUND", f"no API method at {request.method} {request.path}")
    return JsonResponse(body, status=404)


def urlpatterns() -> list[URLPattern]:
    patterns: list[URLPattern] = []
    for regex, methods in routes().items():
        view = RpcView.as_view(routes=methods, http_method_names=[m.lower() for m in methods])
        first = next(iter(methods.values()))
        patterns.append(re_path(regex, view, name=f"rest-{first.rpc}-{len(patterns)}"))
    return patterns
