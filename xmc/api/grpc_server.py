"""The gRPC server: `cloud.xmanager.v1.ExperimentStateService` and friends on one port.

Called by ``manage.py grpcserver`` (`xmc.management.commands.grpcserver`) and
by the tests, which start it in-process on a free port. `build_server` wires:

* ``cloud.xmanager.v1.ExperimentStateService`` (all 26 methods) through the
  servicer base class and ``add_..._to_server`` generated in the ``xmanager``
  wheel, so method names, message types and registration are exactly the
  client's;
* ``google.longrunning.Operations`` the same way, from googleapis-common-protos;
* ``cloud.xmanager.v1.DashboardService`` (11 methods) from the same wheel
  (handlers in ``xmc.api.dashboards``);
* ``grpc.health.v1.Health`` (SERVING for ``""`` and every API service name) and
  server reflection for all of them.

Every API method does the same thing (`_Delegate`): read the caller that
`xmc.auth.grpc.AuthInterceptor` bound (`xmc.auth.identity.current_identity`),
run the registered handler through `xmc.api.registry.invoke`, and turn
`core.errors.ServiceError` into the status code it names. Anything unexpected
is INTERNAL with a generic message; the traceback goes to the log only.

Database connections: grpcio runs handlers on a fixed thread pool whose
threads live as long as the server, and Django keeps one connection per
thread. `_DbConnectionsInterceptor` (outermost, so it also covers the
interceptor's user lookup) calls `django.db.close_old_connections` before and
after every RPC, as Django does around an HTTP request: a broken or
expired connection is dropped, ``CONN_MAX_AGE`` is honoured, and the number
of connections never exceeds the number of worker threads. Unlike an HTTP
request, an RPC skips the ``CONN_HEALTH_CHECKS`` ``SELECT 1`` (see
`_skip_health_checks`). Both interceptors build each method's wrapped
handler once and reuse it.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections, connections
from google.longrunning import operations_pb2_grpc
from google.rpc import error_details_pb2
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from core import pb
from core.errors import ServiceError
from core.signals import stop_event
from core.protos import metrics_pb2
from xmc import ops
from xmc.api import metrics_write, registry
from xmc.auth.grpc import AuthInterceptor
from xmc.auth.identity import Unauthenticated, current_asserted_email, current_identity
from xmc.listing.errors import ListingError

logger = logging.getLogger(__name__)

ESS = registry.ESS
OPERATIONS = registry.OPERATIONS
DASHBOARDS = registry.DASHBOARDS
HEALTH = health.SERVICE_NAME
#: The API services (health reports each of them).
API_SERVICES: tuple[str, ...] = (ESS, OPERATIONS, DASHBOARDS)
#: Our own service beside them: jobs write metric points (core/protos/metrics.proto).
METRICS = metrics_write.METRICS_SERVICE
#: Everything the server answers, as listed by reflection.
SERVICE_NAMES: tuple[str, ...] = (*API_SERVICES, METRICS, HEALTH, reflection.SERVICE_NAME)

INTERNAL_MESSAGE = "internal error; the server logged the details"

# The health servicer and thread pool of each server built here, for `stop_gracefully`/`shutdown`.
_HEALTH_OF: weakref.WeakKeyDictionary[grpc.Server, health.HealthServicer] = weakref.WeakKeyDictionary()
_POOL_OF: weakref.WeakKeyDictionary[grpc.Server, ThreadPoolExecutor] = weakref.WeakKeyDictionary()


def service_methods(service: str) -> tuple[str, ...]:
    """The method names of ``service`` as its descriptor declares them."""
    if service == ESS:
        descriptor = pb.api.DESCRIPTOR.services_by_name["ExperimentStateService"]
    elif service == OPERATIONS:
        descriptor = pb.longrunning.DESCRIPTOR.services_by_name["Operations"]
    elif service == DASHBOARDS:
        descriptor = pb.dashboard_api.DESCRIPTOR.services_by_name["DashboardService"]
    else:
        raise KeyError(service)
    return tuple(method.name for method in descriptor.methods)


# --- One RPC ------------------------------------------------------------------


@dataclass(frozen=True)
class _Failure:
    code: grpc.StatusCode
    message: str
    field: str | None = None  # the request field at fault, as REST's error ``details`` name it


#: Trailing metadata key of the rich status (``google.rpc.Status``), as grpcio-status reads it.
STATUS_DETAILS_KEY = "grpc-status-details-bin"


def _rich_status(failure: _Failure) -> bytes:
    """``google.rpc.Status`` with a ``BadRequest`` naming the field: the gRPC twin of REST's ``details``."""
    bad_request = error_details_pb2.BadRequest(
        field_violations=[error_details_pb2.BadRequest.FieldViolation(field=failure.field, description=failure.message)]
    )
    status = pb.rpc_status.Status(code=failure.code.value[0], message=failure.message)
    status.details.add().Pack(bad_request)
    return status.SerializeToString()


class _Delegate:
    """The body of every API method: identity in, `registry.invoke`, status out."""

    def __init__(self, service: str, method: str) -> None:
        self.service = service
        self.method = method
        self.full_name = f"/{service}/{method}"

    def __call__(self, request: Message, context: grpc.ServicerContext) -> Message:
        # ``context.abort`` raises, so it is never called inside the ``try`` of
        # `_run` (whose broad ``except`` would swallow it): decide, then abort.
        started = time.perf_counter()
        outcome = self._run(request, context)
        seconds = time.perf_counter() - started
        code = outcome.code.name if isinstance(outcome, _Failure) else "OK"
        ops.observe_rpc("grpc", self.service, self.method, code, seconds)
        # One line per call (JSON with XMC_LOG_FORMAT=json): method, code, duration.
        logger.info("grpc.rpc", extra={"method": self.full_name, "code": code,
                                       "duration_ms": round(seconds * 1000, 1)})
        if isinstance(outcome, _Failure):
            if outcome.field:
                context.set_trailing_metadata(((STATUS_DETAILS_KEY, _rich_status(outcome)),))
            context.abort(outcome.code, outcome.message)
        return outcome

    def _run(self, request: Message, context: grpc.ServicerContext) -> Message | _Failure:
        if (self.service, self.method) not in registry.RPCS:
            return _Failure(grpc.StatusCode.UNIMPLEMENTED, f"{self.full_name} is not implemented by this server")
        try:
            caller = registry.Caller(current_identity(), current_asserted_email() or "")
            return registry.invoke(self.service, self.method, request, caller)
        except ServiceError as exc:
            return _Failure(_status_code(exc.code), exc.message, exc.field)
        except ListingError as exc:
            return _Failure(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        except Unauthenticated as exc:
            return _Failure(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except (OperationalError, InterfaceError):
            # The database went away or refused the connection: a retry may work.
            logger.exception("grpc.database_unavailable", extra={"method": self.full_name})
            return _Failure(grpc.StatusCode.UNAVAILABLE, "database unavailable; retry later")
        except Exception:  # noqa: BLE001 - the last line of defence; never leak a traceback
            logger.exception("grpc.internal_error", extra={"method": self.full_name})
            return _Failure(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


class _MetricsWrite(_Delegate):
    """``xmc.metrics.v1.MetricsService/WriteMetrics``: authenticates itself (`xmc.api.metrics_write`)."""

    def __init__(self) -> None:
        super().__init__(METRICS, "WriteMetrics")

    def _run(self, request: Message, context: grpc.ServicerContext) -> Message | _Failure:
        authorization = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                authorization = value
        try:
            return metrics_write.write_over_grpc(request, authorization)
        except ServiceError as exc:
            return _Failure(_status_code(exc.code), exc.message, exc.field)
        except (OperationalError, InterfaceError):
            logger.exception("grpc.database_unavailable", extra={"method": self.full_name})
            return _Failure(grpc.StatusCode.UNAVAILABLE, "database unavailable; retry later")
        except Exception:  # noqa: BLE001 - the last line of defence; never leak a traceback
            logger.exception("grpc.internal_error", extra={"method": self.full_name})
            return _Failure(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


def _metrics_handler() -> grpc.GenericRpcHandler:
    write = _MetricsWrite()
    return grpc.method_handlers_generic_handler(METRICS, {
        "WriteMetrics": grpc.unary_unary_rpc_method_handler(
            write, request_deserializer=metrics_pb2.WriteMetricsRequest.FromString,
            response_serializer=metrics_pb2.WriteMetricsResponse.SerializeToString),
    })


def _status_code(name: str) -> grpc.StatusCode:
    try:
        code = grpc.StatusCode[name]
    except KeyError:
        logger.error("grpc.unknown_status_code", extra={"code": name})
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.INTERNAL if code is grpc.StatusCode.OK else code


def _servicer(base: type, service: str) -> Any:
    """An instance of the generated servicer ``base`` whose every method delegates."""
    namespace: dict[str, Any] = {"__doc__": f"{service}: every method runs the registered handler."}
    for method in service_methods(service):
        namespace[method] = _bound(_Delegate(service, method))
    return type(f"{base.__name__}Delegating", (base,), namespace)()


def _bound(delegate: _Delegate) -> Callable[[Any, Message, grpc.ServicerContext], Message]:
    def method(self: Any, request: Message, context: grpc.ServicerContext) -> Message:
        return delegate(request, context)

    method.__name__ = delegate.method
    return method


# --- Django database connections ---------------------------------------------


class _DbConnectionsInterceptor(grpc.ServerInterceptor):
    """``close_old_connections`` around every unary-unary RPC, like Django's request signals.

    Without Django's per-request health check (``CONN_HEALTH_CHECKS``, a
    ``SELECT 1`` before the first query of each request, kept for REST): the
    ``close_old_connections`` after every RPC already tests a connection that
    saw an error and closes it when it is broken (`_skip_health_checks`).
    The wrapped handler of each method is built once and reused.
    """

    def __init__(self) -> None:
        # method -> (the handler it wraps, the wrapper); a dict write is atomic.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # health Watch and reflection streams never touch the database
        cached = self._wrapped.get(handler_call_details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _with_connection_care(handler)
        self._wrapped[handler_call_details.method] = (handler, wrapped)
        return wrapped


class _Unparsable:
    """What `_tolerant` hands the method when the request bytes are no valid message."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """The request deserializer, answering `_Unparsable` instead of raising.

    gRPC answers INTERNAL ("Exception deserializing request!") when the
    deserializer raises, e.g. on a string field that is not UTF-8; the bytes
    are the caller's fault, so the method answers INVALID_ARGUMENT instead.
    """
    if deserialize is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:  # noqa: BLE001 - DecodeError, or a UnicodeDecodeError from the C parser
            return _Unparsable(exc)

    return parse


def _with_connection_care(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    inner = handler.unary_unary

    def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, _Unparsable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"the request is not a valid message (a string that is not UTF-8?): {request.error}"[:500])
        _close_old_connections()
        _skip_health_checks()
        try:
            return inner(request, context)
        finally:
            _close_old_connections()

    return grpc.unary_unary_rpc_method_handler(
        unary_unary,
        request_deserializer=_tolerant(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


def _close_old_connections() -> None:
    """`django.db.close_old_connections`; a database that is down is the handler's problem."""
    try:
        close_old_connections()
    except DatabaseError:
        logger.warning("grpc.close_old_connections_failed", exc_info=True)


def _skip_health_checks() -> None:
    """Mark this thread's open connections as checked, so the RPC's first query is not a ``SELECT 1``.

    Safe here because every RPC ends with `_close_old_connections`, which
    checks (``is_usable``) and closes a connection that raised a database
    error. What it gives up: a connection that broke while idle (the
    database restarted) fails the one RPC that next uses it with UNAVAILABLE
    ("retry later", `_Delegate`); that RPC's error gets the connection
    closed, and the retry opens a new one.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            conn.health_check_done = True  # type: ignore[attr-defined]  # no stub; see close_if_health_check_failed


# --- The server --------------------------------------------------------------


def build_server(
    port: int,
    max_workers: int | None = None,
    *,
    host: str = "[::]",
    interceptors: Iterable[grpc.ServerInterceptor] | None = None,
    reuse_port: bool = False,
) -> tuple[grpc.Server, int]:
    """A server ready to start (not started) and the port it bound.

    ``port=0`` picks a free port. ``max_workers`` defaults to
    ``settings.XMC_GRPC_MAX_WORKERS`` and is also the most Postgres
    connections the server will hold. ``interceptors`` replaces the default
    ``[AuthInterceptor()]`` (tests); the connection interceptor is always
    outermost. ``reuse_port=True`` lets several processes serve one port
    (SO_REUSEPORT; the kernel spreads connections over them) -- only on
    purpose: by default a taken port is an error.
    """
    workers = max_workers if max_workers is not None else settings.XMC_GRPC_MAX_WORKERS
    chain: list[grpc.ServerInterceptor] = [_DbConnectionsInterceptor()]
    chain += list(interceptors) if interceptors is not None else [AuthInterceptor()]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xmc-grpc")
    # SO_REUSEPORT only when asked: otherwise a second server on a taken port
    # must fail to start, not silently share the port (and the traffic).
    server = grpc.server(pool, interceptors=chain, options=[("grpc.so_reuseport", int(reuse_port))])
    _POOL_OF[server] = pool

    pb.api_grpc.add_ExperimentStateServiceServicer_to_server(
        _servicer(pb.api_grpc.ExperimentStateServiceServicer, ESS), server
    )
    operations_pb2_grpc.add_OperationsServicer_to_server(
        _servicer(operations_pb2_grpc.OperationsServicer, OPERATIONS), server
    )
    pb.dashboard_grpc.add_DashboardServiceServicer_to_server(
        _servicer(pb.dashboard_grpc.DashboardServiceServicer, DASHBOARDS), server
    )
    server.add_generic_rpc_handlers((_metrics_handler(),))

    health_servicer = health.HealthServicer()
    for name in ("", *API_SERVICES, METRICS):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(SERVICE_NAMES, server)
    _HEALTH_OF[server] = health_servicer

    missing = [
        f"{service}/{method}"
        for service in API_SERVICES
        for method in service_methods(service)
        if (service, method) not in registry.RPCS
    ]
    if missing:
        logger.warning("grpc.unregistered_methods", extra={"count": len(missing), "methods": ",".join(missing)})

    try:
        bound_port = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # grpcio: "Failed to bind to address ..."
        raise OSError(f"could not bind the gRPC server to {host}:{port}: {exc}") from exc
    if bound_port == 0:
        raise OSError(f"could not bind the gRPC server to {host}:{port}")
    return server, bound_port


def stop_gracefully(server: grpc.Server, grace_s: float = 10.0) -> threading.Event:
    """Report NOT_SERVING, refuse new RPCs, let running ones finish for ``grace_s``."""
    health_servicer = _HEALTH_OF.get(server)
    if health_servicer is not None:
        health_servicer.enter_graceful_shutdown()
    return server.stop(grace_s)


def shutdown(server: grpc.Server, grace_s: float = 10.0) -> None:
    """`stop_gracefully`, wait for it, then end the worker threads.

    Each worker thread holds its own Django connection (with ``CONN_MAX_AGE``
    > 0, between RPCs too); ending the threads releases them.
    """
    stop_gracefully(server, grace_s).wait()
    close_worker_connections(server)
    pool = _POOL_OF.pop(server, None)
    if pool is not None:
        pool.shutdown(wait=True)


def close_worker_connections(server: grpc.Server) -> None:
    """Run ``connections.close_all()`` once on every worker thread of ``server``.

    For shutdown, and for tests that must not leave a persistent connection
    open between tests. A thread's connection can only be closed from that
    thread: one task per worker, each held at a barrier until all have
    started, makes every task run on a different thread (RPCs in flight just
    finish first).
    """
    pool = _POOL_OF.get(server)
    if pool is None:
        return
    workers: int = pool._max_workers  # noqa: SLF001 - no public accessor
    barrier = threading.Barrier(workers)

    def close_mine() -> None:
        try:
            connections.close_all()
        finally:
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                pass

    futures.wait([pool.submit(close_mine) for _ in range(workers)], timeout=10)


def watch_database_health(server: grpc.Server, interval_s: float | None = None) -> threading.Event:
    """Keep the gRPC health service in step with the database: NOT_SERVING while it is down.

    A daemon thread checks the database (``xmc.ops.check_database``, on a
    new connection each time, bounded by ``XMC_DB_CONNECT_TIMEOUT_S``) every
    ``interval_s`` (``XMC_HEALTH_CHECK_INTERVAL_S``) and sets every service
    name to SERVING or NOT_SERVING; after a graceful shutdown began the
    servicer ignores it. Returns the event that stops it.
    """
    stop = threading.Event()
    health_servicer = _HEALTH_OF.get(server)
    interval = settings.XMC_HEALTH_CHECK_INTERVAL_S if interval_s is None else interval_s

    def watch() -> None:
        serving = True
        try:
            while not stop.is_set():
                try:
                    ops.check_database()
                    ok = True
                except Exception:  # noqa: BLE001 - any failure: not serving
                    ok = False
                finally:
                    connections.close_all()  # each round proves a new connection can be made
                if ok != serving:
                    serving = ok
                    logger.warning("grpc.health serving=%s (database %s)", ok, "up" if ok else "down")
                if health_servicer is not None:
                    status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
                    for name in ("", *API_SERVICES, METRICS):
                        health_servicer.set(name, status)
                stop.wait(interval)
        finally:
            connections.close_all()

    threading.Thread(target=watch, name="xmc-grpc-health", daemon=True).start()
    return stop


def serve_until_signalled(server: grpc.Server, grace_s: float = 10.0) -> None:
    """Start ``server`` and block until SIGTERM or SIGINT, then stop gracefully.

    Must run on the main thread (signal handlers can only be set there).
    """
    def on_stop(signum: int) -> None:
        logger.info("grpc.stopping", extra={"signal": signal.Signals(signum).name, "grace_s": grace_s})
        shutdown(server, grace_s)

    with stop_event(on_stop=on_stop) as stopped:
        watching = watch_database_health(server)
        try:
            server.start()
            # wait(timeout) in a loop: the main thread must wake up to run the handler.
            while not stopped.wait(0.5):
                pass
        finally:
            watching.set()
    logger.info("grpc.stopped")
