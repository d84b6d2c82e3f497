"""The ACL matrix over REST: every RPC's binding x every persona, and anonymous.

The same cases as tests/api/test_authorization_matrix.py, sent as HTTP
requests built from the binding table: allowed calls answer 2xx, forbidden
ones 403 (404 for a dashboard or short chart name the caller may not read,
as for a missing one), calls without a token 401.
"""
from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
import json

from google.protobuf import json_format
from google.protobuf.message import Message

from experiments.acl import Role
from tests.api.acl_cases import CASES, NOT_FOUND_WHEN_UNREADABLE, PERSONAS, build_world
from tests.api.acl_personas import persona_tokens
from xmc.api.rest import BINDINGS, Binding

pytestmark = pytest.mark.django_db
VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)(?:=[^}]*)?\}")


def field_value(message: Message, dotted: str) -> str:
    value: Any = message
    for part in dotted.split("."):
        value = getattr(value, part)
    return str(value)


def to_http(request: Message, service: str, method: str) -> tuple[Binding, str, dict[str, Any] | None, dict]:
    """The first binding of the RPC whose path the request's fields fill."""
    for binding in BINDINGS:
        if (binding.service, binding.rpc) != (service, method):
            continue
        path = VARIABLE.sub(lambda m: field_value(request, m.group(1)), binding.template)
        if not re.match(binding.path.regex, path[1:]):
            continue
        path_fields = {v.field_path.split(".")[0] for v in binding.path.variables}
        body = None
        if binding.body == "*":
            body = {k: v for k, v in json_format.MessageToDict(request, preserving_proto_field_name=True).items()
                    if k not in path_fields}
        elif binding.body:
            body = json_format.MessageToDict(getattr(request, binding.body))
        query = {}
        if "update_mask" in request.DESCRIPTOR.fields_by_name and request.update_mask.paths:
            query["updateMask"] = ",".join(request.update_mask.paths)
        return binding, path, body, query
    raise AssertionError(f"no binding fits {method} {request}")


def call(client: Client, token: str | None, service: str, method: str, request: Message) -> int:
    binding, path, body, query = to_http(request, service, method)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    url = path + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    response = client.generic(binding.http_method, url, data=json.dumps(body) if body is not None else "",
                              content_type="application/json", **headers)
    return response.status_code


REST_CASES = {key: case for key, case in CASES.items() if any((b.service, b.rpc) == key for b in BINDINGS)}


def test_it_has_a_binding_for_every_case_but_wait_operation() -> None:
    assert set(CASES) - set(REST_CASES) == {("google.longrunning.Operations", "WaitOperation")}


@pytest.mark.parametrize("persona", sorted(PERSONAS) + ["anonymous"])
def test_it_enforces_the_acl_over_rest(persona: str) -> None:
    tokens = persona_tokens()
    client = Client()
    outcomes = {}
    for key, (build, needed) in sorted(REST_CASES.items()):
        world = build_world()
        status = call(client, tokens.get(persona), *key, build(world))
        if persona == "anonymous":
            expected = 401
        else:
            role = PERSONAS[persona][1]
            expected = (200 if role >= needed else 404 if key in NOT_FOUND_WHEN_UNREADABLE and role < Role.READER
                        else 403)
        outcomes[key[1]] = (status, expected)
    assert {k: v for k, v in outcomes.items() if v[0] != v[1]} == {}
