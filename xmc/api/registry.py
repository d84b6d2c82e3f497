"""The RPC table: every method of the API, its messages and its handler.

``xmc.api.handlers`` registers one function per RPC with ``rpc``; the gRPC
server (``xmc.api.grpc_server``) and the REST views (``xmc.api.rest``) both
look methods up here and call ``invoke``, so both transports run exactly the
same code: parse names, check ACLs, validate, call a service, convert.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from xmc.auth.identity import Identity


@dataclass(frozen=True)
class Caller:
    """Who is calling: the verified identity; the asserted email is audit only."""

    identity: Identity
    asserted_email: str = ""

    @property
    def email(self) -> str:
        return self.identity.email


Handler = Callable[[Any, Caller], Message]


@dataclass(frozen=True)
class Rpc:
    service: str  # full service name, e.g. "cloud.xmanager.v1.ExperimentStateService"
    method: str  # e.g. "CreateExperiment"
    request: type[Message]
    response: type[Message]
    handler: Handler

    @property
    def full_name(self) -> str:
        return f"/{self.service}/{self.method}"


ESS = "cloud.xmanager.v1.ExperimentStateService"
OPERATIONS = "google.longrunning.Operations"

#: (service, method) -> Rpc
RPCS: dict[tuple[str, str], Rpc] = {}


def rpc(service: str, method: str, request: type[Message], response: type[Message]) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        RPCS[(service, method)] = Rpc(service, method, request, response, fn)
        return fn

    return register


def invoke(service: str, method: str, request: Message, caller: Caller) -> Message:
    """Run one RPC. Raises ``xmc.errors.ServiceError`` subclasses on failure."""
    import xmc.api.handlers  # noqa: F401 - registers the handlers

    return RPCS[(service, method)].handler(request, caller)
