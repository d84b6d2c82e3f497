"""The RPC table: every method of the API, its messages and its handler.

``xmc.api.handlers`` registers one function per RPC with ``rpc``; the gRPC
server (``xmc.api.grpc_server``) and the REST views (``xmc.api.rest``) both
look methods up here and call ``invoke``, so both transports run exactly the
same code: parse names, check ACLs, validate, call a service, convert.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.db import DataError
from google.protobuf.message import Message

from core import limits
from core.errors import InvalidArgument
from xmc.auth.identity import Identity

logger = logging.getLogger(__name__)


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
DASHBOARDS = "cloud.xmanager.v1.DashboardService"

#: (service, method) -> Rpc
RPCS: dict[tuple[str, str], Rpc] = {}


def rpc(service: str, method: str, request: type[Message], response: type[Message]) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        RPCS[(service, method)] = Rpc(service, method, request, response, fn)
        return fn

    return register


def invoke(service: str, method: str, request: Message, caller: Caller) -> Message:
    """Run one RPC. Raises ``core.errors.ServiceError`` subclasses on failure.

    Before the handler: any string of the request holding U+0000 is refused
    (Postgres cannot store it), and the audit-only asserted email is cut to a
    storable length. After it, as a backstop only (every known case is
    validated earlier, naming its field): a value the database refuses
    (``DataError``: too long, out of range, ...), input nested past the
    interpreter's recursion limit, or a number too large to convert is the
    caller's fault, so INVALID_ARGUMENT, never INTERNAL. The durable
    transaction of the service rolled back, so nothing was written.
    """
    limits.reject_nul(request)
    if len(caller.asserted_email) > limits.EMAIL or "\x00" in caller.asserted_email:
        caller = replace(caller, asserted_email=caller.asserted_email.replace("\x00", "")[: limits.EMAIL])
    try:
        return RPCS[(service, method)].handler(request, caller)
    except DataError as exc:
        logger.warning("api.data_error", extra={"method": f"{service}/{method}", "error": str(exc)})
        raise InvalidArgument(f"a value of the request is out of range or too long for the database: {exc}") from None
    except (RecursionError, OverflowError) as exc:
        logger.warning("api.bad_input", extra={"method": f"{service}/{method}", "error": repr(exc)})
        raise InvalidArgument(f"the request holds a value out of range or nested too deeply ({type(exc).__name__})") from None
