"""Fuzz: every RPC's request message, over gRPC and REST, never answers INTERNAL / 500.

Hypothesis builds request messages from each method's descriptor: strings
(unicode, NUL, very long), integers over the whole int64/uint64 range, any
enum number, nested messages and repeated fields. Name-like fields are drawn
half the time from real names of Alice's world, so the fuzz reaches the
services and the database, not only the name parser. The example count is
bounded (``FUZZ_EXAMPLES`` per RPC and transport) to keep the run to a few
minutes on a loaded machine.
"""
from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any

import grpc
import pytest
from django.test import Client
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from artifacts import services as artifact_services
from metrics import services as metric_services
from core import pb
from tests import factories
from tests.api.grpc_server.conftest import metadata_for
from xmc.api import registry, rest
from xmc.auth.tokens import issue_token

FUZZ_EXAMPLES = 8
ALICE = "fuzz-alice@example.com"
BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}

INT_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
NASTY_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["\x00", "a\x00b", "x" * 5000, "\u0663", "1\n", "experiments/\u0663", "ſtaff@example.com",
                     'title = "\x00"', 'create_time > "2020-01-01T00:00:00+23:59"', "9" * 25, "-1", "*", "%00"]),
)
NAME_FIELDS = {"name", "parent", "parent_experiment", "parent_workunit"}


def _names(world: dict[str, str]) -> st.SearchStrategy[str]:
    return st.sampled_from(sorted(set(world.values())))


def message_strategy(descriptor: Descriptor, world: dict[str, str], depth: int = 0) -> st.SearchStrategy[Message]:
    cls = _message_class(descriptor)
    field_strategies: dict[str, st.SearchStrategy[Any]] = {}
    for fd in descriptor.fields:
        value = _value_strategy(fd, world, depth)
        if value is None:
            continue
        if fd.is_repeated and not (fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry):
            value = st.lists(value, max_size=2)
        field_strategies[fd.name] = value
    if not field_strategies:
        return st.just(cls())

    @st.composite
    def build(draw: Any) -> Message:
        message = cls()
        chosen = draw(st.lists(st.sampled_from(sorted(field_strategies)), unique=True,
                               max_size=min(4, len(field_strategies))))
        for name in chosen:
            fd = descriptor.fields_by_name[name]
            value = draw(field_strategies[name])
            try:
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    if fd.message_type.GetOptions().map_entry:
                        continue
                    if fd.is_repeated:
                        for item in value:
                            getattr(message, name).add().CopyFrom(item)
                    else:
                        getattr(message, name).CopyFrom(value)
                elif fd.is_repeated:
                    getattr(message, name).extend(value)
                else:
                    setattr(message, name, value)
            except (ValueError, TypeError):
                pass  # e.g. a oneof member set twice, a well-known type refusing a value
        return message

    return build()


def _message_class(descriptor: Descriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def _value_strategy(fd: FieldDescriptor, world: dict[str, str], depth: int) -> st.SearchStrategy[Any] | None:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        if depth >= 3 or fd.message_type.full_name in ("google.protobuf.Any", "google.protobuf.Struct",
                                                        "google.protobuf.Value", "google.protobuf.ListValue"):
            return None
        return message_strategy(fd.message_type, world, depth + 1)
    if fd.type == FieldDescriptor.TYPE_STRING:
        if fd.name in NAME_FIELDS:
            return st.one_of(_names(world), NASTY_TEXT)
        return NASTY_TEXT
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=8)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return st.integers(-3, 40)
    if fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32 if fd.type == FieldDescriptor.TYPE_FLOAT else 64)
    low, high = INT_BOUNDS[fd.type]
    return st.one_of(st.integers(low, high), st.sampled_from([low, high, 0, 1, -1 if low < 0 else 2, 2**53]))


@pytest.fixture
def world(transactional_db: None) -> dict[str, str]:
    return build_world()


def build_world(tag: str = "fz") -> dict[str, str]:
    """Alice's experiment, work unit, artifact, operation, chart and dashboard: their names by kind.

    ``tag`` is the chart's and the dashboard's id: a second world beside the first needs another.
    """
    exp = factories.experiment(ALICE, title="fuzz")
    wu = factories.work_unit(exp, wid=1)
    artifact = artifact_services.create_artifact(exp.id, 1, pb.artifact.Artifact(notes="n"))
    op = wu.operations.order_by("id").first()
    assert op is not None
    chart = metric_services.create_chart(wu, pb.dashboard.Chart(title="c", plots=[pb.dashboard.PlotSpec(
        plot_id="p", type=pb.dashboard.SCATTER, data=pb.dashboard.DataSpec(metrics=["loss"]))]), tag, creator=ALICE)
    metric_services.create_dashboard(pb.dashboard.Dashboard(title="d"), tag, owner=ALICE, referenced=[chart],
                                     inline=[])
    return {"experiment": exp.name, "work_unit": wu.name, "artifact": artifact.name, "operation": op.name,
            "missing": "experiments/987654321", "operations": f"{exp.name}/operations",
            "chart": chart.name, "short_chart": f"charts/{tag}", "dashboard": f"dashboards/{tag}",
            "dashboard_chart": f"dashboards/{tag}/charts/{tag}"}




def _all_rpcs() -> list[tuple[str, str]]:
    import xmc.api.handlers  # noqa: F401 - registers every RPC

    return sorted(registry.RPCS)


@pytest.fixture
def fuzz_settings(settings: Any) -> None:
    settings.XMC_RATE_LIMIT_PER_S = 0  # the fuzz is one identity making many calls
    settings.XMC_WAIT_MAX_S = 0.1


@pytest.mark.parametrize("service,method", _all_rpcs(), ids=lambda v: v.rsplit(".", 1)[-1])
def test_it_never_answers_internal_over_grpc(world: dict[str, str], channel: grpc.Channel, fuzz_settings: None,
                                             service: str, method: str) -> None:
    rpc = registry.RPCS[(service, method)]
    call = channel.unary_unary(rpc.full_name, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=lambda b: b)
    metadata = metadata_for(ALICE, "x" * 400 + "@example.com")

    @hsettings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
               suppress_health_check=list(HealthCheck))
    @given(message_strategy(rpc.request.DESCRIPTOR, world))
    def one(request: Message) -> None:
        try:
            call(request, metadata=metadata, timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() not in BAD_CODES, (method, request, exc.details())

    one()


def _bindings(method: str) -> list[rest.Binding]:
    return [b for b in rest.BINDINGS if b.rpc == method]


def _url(binding: rest.Binding, request: Message, world: dict[str, str]) -> str | None:
    path = binding.template
    for variable in binding.path.variables:
        value: Any = request
        for part in variable.field_path.split("."):
            value = getattr(value, part, "")
        regex = "".join("[^/:]+" if seg == "*" else "[^:]+" if seg == "**" else re.escape(seg)
                        for seg in re.split(r"(\*\*|\*)", variable.pattern))
        if not (isinstance(value, str) and re.fullmatch(regex, value)):
            candidates = [n for n in world.values() if re.fullmatch(regex, n)]
            if not candidates:
                return None
            value = candidates[0]
        pattern = "{" + variable.field_path + ("=" + variable.pattern if "=" + variable.pattern in path else "") + "}"
        path = path.replace(pattern, urllib.parse.quote(value, safe="/"))
    return path


@pytest.mark.parametrize("service,method", _all_rpcs(), ids=lambda v: v.rsplit(".", 1)[-1])
def test_it_never_answers_500_over_rest(world: dict[str, str], fuzz_settings: None, service: str,
                                        method: str) -> None:
    rpc = registry.RPCS[(service, method)]
    bindings = _bindings(method)
    if not bindings:
        pytest.skip(f"{method} has no HTTP binding")
    client = Client()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {issue_token(ALICE)}",
               "HTTP_X_GOOG_USER_EMAIL": "y" * 400 + "@example.com"}

    @hsettings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
               suppress_health_check=list(HealthCheck))
    @given(message_strategy(rpc.request.DESCRIPTOR, world), st.sampled_from(bindings))
    def one(request: Message, binding: rest.Binding) -> None:
        url = _url(binding, request, world)
        if url is None:
            return
        query: dict[str, str] = {}
        body = ""
        if binding.body:
            target = request if binding.body == "*" else getattr(request, binding.body)
            try:
                body = json.dumps(json_format.MessageToDict(target))
            except json_format.SerializeToJsonError:
                return  # not expressible in proto3 JSON (e.g. Timestamp nanos -1): gRPC covers it
        else:
            for fd, value in request.ListFields():
                if fd.type not in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_BYTES) and not fd.is_repeated:
                    query[fd.json_name] = str(value)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        response = client.generic(binding.http_method, url, body, content_type="application/json", **headers)
        assert response.status_code < 500, (method, url, body[:300], response.content[:500])

    one()
