"""gRPC adapter of the identity layer: authenticate and meter every RPC.

Install `xmc.auth.grpc.AuthInterceptor` on the gRPC server (``manage.py
grpcserver``)::

    server = grpc.server(executor, interceptors=[AuthInterceptor()])

For each RPC (except health checking and server reflection, which load
balancers and tools call without credentials) it reads ``authorization:
Bearer <token>`` from the invocation metadata, verifies it with the shared
verifier `xmc.auth.identity.authenticate_bearer`, takes one token from the
caller's rate-limit bucket (`core.ratelimit.check_rate`; after the signature
check, before the user lookup, so refused calls cost no query) and binds the
identity for the handler, which reads it with `xmc.auth.identity.current_identity`.
Failures end the RPC with UNAUTHENTICATED or RESOURCE_EXHAUSTED and a message
saying what to do. The ``x-goog-user-email`` metadata the client asserts is
bound too, for audit (`xmc.auth.identity.current_asserted_email`); it never
influences who the caller is.

Why the work happens inside the wrapped handler and not in
``intercept_service``: grpcio runs ``intercept_service`` on the server's single
request-dispatch thread, so a database lookup there would serialize every RPC.
The wrapped behaviour runs on the handler's worker thread, and only there may
``context.abort`` be called.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from django.db import DatabaseError

from core.ratelimit import RateDecision, check_rate
from xmc.auth.identity import Identity, Unauthenticated, authenticate_bearer, bound_identity

logger = logging.getLogger(__name__)

AUTHORIZATION_KEY = "authorization"

#: Prefix of the DashboardService's methods: their callers without a token get `DASHBOARD_NO_TOKEN`.
DASHBOARD_METHODS = "/cloud.xmanager.v1.DashboardService/"
#: The wheel's ``xm_cloud.create_dashboard`` / ``get_dashboard`` / ``list_dashboards`` open a bare
#: channel and send no credentials; nobody may write (or read) anonymously, so say what works.
DASHBOARD_NO_TOKEN = (
    "the DashboardService needs a bearer token (authorization: Bearer <token>); the xm_cloud.dashboard "
    "helpers (create_dashboard, get_dashboard, list_dashboards) send none: use the xdash CLI or "
    "xdash.DashboardClient with XMC_AUTH_TOKEN set (XMC_DASHBOARD_ENDPOINT=host:port), or the REST API "
    "(/v1/dashboards) with Authorization: Bearer <token>"
)
ASSERTED_EMAIL_KEY = "x-goog-user-email"
RETRY_AFTER_MS_KEY = "retry-after-ms"

# Methods callable without a bearer JWT: infrastructure, no user data -- and the metrics
# write path, which authenticates itself (a job's per-execution metrics token is no JWT;
# `xmc.api.metrics_write.execution_for` checks it, or a user's token, on every call).
DEFAULT_EXEMPT_PREFIXES: tuple[str, ...] = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
    "/xmc.metrics.v1.MetricsService/",
)


class AuthInterceptor(grpc.ServerInterceptor):
    """Authenticates (bearer JWT) and rate-limits every non-exempt RPC.

    ``rate_limit=False`` turns metering off (for servers that must never
    refuse, e.g. an internal admin port). The wrapped handler of each method
    is built once, on its first call, and reused: per call only the
    metadata is read (from the call's context) and the caller checked.
    """

    def __init__(
        self,
        *,
        exempt_prefixes: Sequence[str] = DEFAULT_EXEMPT_PREFIXES,
        rate_limit: bool = True,
    ) -> None:
        self._exempt_prefixes = tuple(exempt_prefixes)
        self._rate_limit = rate_limit
        # method -> (the handler it wraps, the wrapper); a dict write is atomic.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(self._exempt_prefixes):
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _wrap_handler(handler, _Gate(method, self._rate_limit))
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def _read_metadata(metadata: Sequence[Any]) -> tuple[str | None, str | None, bool]:
    """(authorization value, asserted email, whether authorization came more than once)."""
    authorizations: list[str] = []
    asserted_email: str | None = None
    for key, value in metadata:
        if key == AUTHORIZATION_KEY:
            authorizations.append(value if isinstance(value, str) else value.decode("latin-1"))
        elif key == ASSERTED_EMAIL_KEY and asserted_email is None:
            asserted_email = value if isinstance(value, str) else value.decode("utf-8", "replace")
    return (authorizations[0] if authorizations else None), asserted_email, len(authorizations) > 1


class _Gate:
    """The per-RPC check of one method, run on the handler's thread before the handler."""

    def __init__(self, method: str, rate_limit: bool) -> None:
        self.method = method
        self.rate_limit = rate_limit

    def admit(self, context: grpc.ServicerContext) -> tuple[Identity, str | None]:
        """The caller's identity and asserted email, or abort the RPC (``context.abort`` raises)."""
        authorization, asserted_email, duplicate = _read_metadata(context.invocation_metadata() or ())
        if duplicate:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "more than one authorization header")
        if authorization is None and self.method.startswith(DASHBOARD_METHODS):
            logger.info("auth.grpc.rejected", extra={"method": self.method, "peer": context.peer(),
                                                     "reason": "no token (dashboard)"})
            context.abort(grpc.StatusCode.UNAUTHENTICATED, DASHBOARD_NO_TOKEN)
        try:
            # The rate limit is checked between the token checks and the user
            # lookup, so refused calls cost no database query.
            identity = authenticate_bearer(authorization, admit=self._meter if self.rate_limit else None)
        except Unauthenticated as exc:
            logger.info("auth.grpc.rejected", extra={"method": self.method, "peer": context.peer(), "reason": str(exc)})
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except _RateLimited as limited:
            logger.debug("auth.grpc.rate_limited", extra={"method": self.method, "email": limited.email})
            retry_after_s = limited.decision.retry_after_s
            context.set_trailing_metadata(((RETRY_AFTER_MS_KEY, str(int(retry_after_s * 1000))),))
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"rate limit exceeded for {limited.email}: retry in {retry_after_s:.3f}s",
            )
        except DatabaseError:
            logger.exception("auth.grpc.lookup_failed", extra={"method": self.method})
            context.abort(grpc.StatusCode.UNAVAILABLE, "identity lookup failed; retry later")
        return identity, asserted_email

    @staticmethod
    def _meter(email: str) -> None:
        decision = check_rate(email)
        if not decision.allowed:
            raise _RateLimited(email, decision)


class _RateLimited(Exception):
    def __init__(self, email: str, decision: RateDecision) -> None:
        super().__init__(email)
        self.email = email
        self.decision = decision


def _wrap_handler(handler: grpc.RpcMethodHandler, gate: _Gate) -> grpc.RpcMethodHandler:
    """The same handler with ``gate`` in front and the identity bound around it."""
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            identity, asserted_email = gate.admit(context)
            with bound_identity(identity, asserted_email):
                return inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            identity, asserted_email = gate.admit(context)
            return _bound_iterator(identity, asserted_email, lambda: inner_us(request, context))

        return grpc.unary_stream_rpc_method_handler(
            unary_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        def stream_unary(request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
            identity, asserted_email = gate.admit(context)
            with bound_identity(identity, asserted_email):
                return inner_su(request_iterator, context)

        return grpc.stream_unary_rpc_method_handler(
            stream_unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    inner_ss = handler.stream_stream

    def stream_stream(request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        identity, asserted_email = gate.admit(context)
        return _bound_iterator(identity, asserted_email, lambda: inner_ss(request_iterator, context))

    return grpc.stream_stream_rpc_method_handler(
        stream_stream,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _bound_iterator(
    identity: Identity, asserted_email: str | None, start: Callable[[], Iterator[Any]]
) -> Iterator[Any]:
    """Run a streaming handler with the identity bound while it produces responses."""
    with bound_identity(identity, asserted_email):
        yield from start()
