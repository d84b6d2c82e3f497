"""Operator endpoints of the web process: liveness, readiness and Prometheus metrics.

Who calls it: the load balancer / kubelet probes (``GET /healthz``,
``GET /readyz``), Prometheus (``GET /metrics``), and every RPC transport,
which reports each call through `xmc.ops.observe_rpc` (the REST view
`xmc.api.rest.RpcView` with ``transport="rest"``, the gRPC server's
per-call wrapper in ``xmc.api.grpc_server`` with ``transport="grpc"``).

None of these endpoints needs a token: probes and scrapers have none, and
they reveal no tenant data (counts per RPC and code only).

Metrics live in the process's default ``prometheus_client`` registry. Under
gunicorn with several workers, set ``PROMETHEUS_MULTIPROC_DIR`` to an empty,
writable directory (read by ``prometheus_client`` itself) and ``/metrics``
then aggregates every worker through ``prometheus_client.multiprocess``.
"""
from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.db import connection, connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from delivery import declare
from workunits.delivery import oldest_pending

logger = logging.getLogger(__name__)

#: Seconds a readiness check may take before it counts as failed.
CHECK_TIMEOUT_S = 2.0

RPC_REQUESTS = Counter(
    "xmc_rpc_requests",
    "RPCs served, by transport (grpc, rest), service, method and canonical status code.",
    ["transport", "service", "method", "code"],
)
RPC_LATENCY = Histogram(
    "xmc_rpc_duration_seconds",
    "Wall time of one RPC in the server, from authentication to the encoded response.",
    ["transport", "service", "method"],
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


# The tasks' own metrics (xmc_celery_tasks, xmc_celery_task_duration_seconds) are counted by their
# base class, delivery.declare.Task, and served here by serve_metrics like every other.
assert declare.TASKS is not None


def delivery_status(ages: dict[str, float]) -> dict[str, object]:
    """The ``delivery`` part of ``/readyz``: the oldest pending row's age over every queue, and whether
    it is past ``XMC_DEGRADED_AFTER_S``."""
    oldest = max(ages.values(), default=0.0)
    return {"oldestPendingSeconds": round(oldest, 1),
            "status": "degraded" if oldest > settings.XMC_DEGRADED_AFTER_S else "ok",
            "queues": {queue: round(age, 1) for queue, age in sorted(ages.items())}}


class DeliveryCollector(Collector):
    """``xmc_delivery_oldest_pending_seconds{queue}``, read from the database at each scrape.

    The rows are the truth (``workunits.delivery.oldest_pending``), so every
    process serves the same value and a frozen worker cannot hide its own
    backlog: the web's ``/metrics`` shows it. A failed read is logged and the
    gauge left out of that scrape. ``close_after``: the scrape runs on a
    thread of ``prometheus_client``'s own server (``serve_metrics``: workers,
    gRPC, reconciler), which nothing else closes the connection of.
    """

    close_after = False

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "xmc_delivery_oldest_pending_seconds",
            "Age of the oldest operation or outbox message of the queue that no worker holds (0: none).",
            labels=["queue"],
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()  # registering must not query the database

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = self._family()
        try:
            ages = oldest_pending()
        except Exception:  # noqa: BLE001 - a scrape must never fail for the database's sake
            logger.warning("metrics.delivery_unavailable", exc_info=True)
            return
        finally:
            if self.close_after:
                connections.close_all()  # this thread's only
        for queue, age in sorted(ages.items()):
            gauge.add_metric([queue], age)
        yield gauge


DELIVERY = DeliveryCollector()
REGISTRY.register(DELIVERY)


def metrics_registry() -> CollectorRegistry:
    """This process's registry, or every process's in multiprocess mode (with the delivery gauge)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(DELIVERY)
        return registry
    return REGISTRY


def serve_metrics(port: int) -> None:
    """Expose /metrics on ``port`` from a daemon thread (workers, gRPC, reconciler)."""
    from prometheus_client import start_http_server

    DELIVERY.close_after = True
    start_http_server(port, addr="0.0.0.0", registry=metrics_registry())


def observe_rpc(transport: str, service: str, method: str, code: str, seconds: float) -> None:
    """Count one finished RPC and record its latency.

    ``service`` is the full service name (``cloud.xmanager.v1.ExperimentStateService``),
    ``code`` the canonical status name (``OK``, ``NOT_FOUND``, ...).
    """
    RPC_REQUESTS.labels(transport, service, method, code).inc()
    RPC_LATENCY.labels(transport, service, method).observe(seconds)


class DatabaseUnavailableMiddleware:
    """Any page (admin, login, ...) answers 503 "database unavailable" while Postgres is down, not 500.

    The API's own views answer in their error shape (``xmc.api.rest``); this
    catches what reaches Django's handler from every other view.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        from django.db import InterfaceError, OperationalError, connections

        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.warning("http.database_unavailable", extra={"path": request.path}, exc_info=True)
        for conn in connections.all(initialized_only=True):
            try:
                conn.close_if_unusable_or_obsolete()
            except Exception:  # noqa: BLE001 - closing a dead connection may fail as well
                pass
        response = HttpResponse("database unavailable; retry later\n", status=503, content_type="text/plain")
        response["Retry-After"] = "2"
        return response


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers HTTP. Touches nothing else on purpose."""
    return JsonResponse({"status": "ok"})


def check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def check_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S)
    try:
        client.ping()
    finally:
        client.close()


def check_broker(url: str) -> None:
    if urlsplit(url).scheme in ("redis", "rediss", "unix"):
        check_redis(url)
        return
    # Another transport (amqp, ...): ask kombu, which Celery brings, to connect once.
    from kombu import Connection

    with Connection(url, connect_timeout=CHECK_TIMEOUT_S) as conn:
        conn.ensure_connection(max_retries=1, timeout=CHECK_TIMEOUT_S)


def readiness() -> dict[str, str]:
    """Each dependency -> ``"ok"`` or why it failed. The broker is checked separately only if it differs."""
    checks: dict[str, Callable[[], None]] = {
        "database": check_database,
        "redis": partial(check_redis, settings.REDIS_URL),
    }
    if settings.CELERY_BROKER_URL != settings.REDIS_URL:
        checks["broker"] = partial(check_broker, settings.CELERY_BROKER_URL)
    results: dict[str, str] = {}
    for name, check in checks.items():
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"; say which and why
            results[name] = f"error: {type(exc).__name__}: {exc}"
        else:
            results[name] = "ok"
    return results


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when the database and Redis/the broker answer, 503 naming what failed.

    ``delivery`` says whether work waits for a worker (``delivery_status``):
    "degraded" is still 200, the web can serve; it is left out when the
    database does not answer.
    """
    started = time.perf_counter()
    checks = readiness()
    failed = sorted(name for name, result in checks.items() if result != "ok")
    body: dict[str, object] = {
        "status": "unavailable" if failed else "ok",
        "checks": checks,
        "failed": failed,
    }
    if checks.get("database") == "ok":
        try:
            body["delivery"] = delivery_status(oldest_pending())
        except Exception as exc:  # noqa: BLE001 - readiness answers whatever this read does
            body["delivery"] = {"oldestPendingSeconds": None, "status": f"error: {type(exc).__name__}"}
    body["seconds"] = round(time.perf_counter() - started, 4)
    return JsonResponse(body, status=503 if failed else 200)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of this process (or of all workers in multiprocess mode).

    With ``XMC_METRICS_SCRAPE_TOKEN`` set, only a scraper sending ``Authorization: Bearer <it>``
    reads it (401 otherwise): the RPC counts, identities' rates and errors are nobody else's.
    """
    expected = settings.XMC_METRICS_SCRAPE_TOKEN
    if expected:
        scheme, _, given = str(request.META.get("HTTP_AUTHORIZATION", "")).partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            response = HttpResponse("/metrics needs Authorization: Bearer <XMC_METRICS_SCRAPE_TOKEN>\n", status=401,
                                    content_type="text/plain; charset=utf-8")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)


_FAVICON = Path(__file__).parent / "static" / "xmc" / "favicon.svg"


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``: the site's icon (the one the pages link as ``xmc/favicon.svg``), asked for by every browser."""
    response = HttpResponse(_FAVICON.read_bytes(), content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response
