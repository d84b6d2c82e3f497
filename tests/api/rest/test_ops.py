"""Operator endpoints: liveness, readiness naming what failed, and Prometheus metrics per RPC and transport."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError
from prometheus_client import REGISTRY

from tests.api.rest.conftest import Api, World

pytestmark = pytest.mark.django_db

ESS = "cloud.xmanager.v1.ExperimentStateService"


def test_it_answers_liveness_without_touching_anything(anonymous_api: Api,
                                                       django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(0):
        response = anonymous_api.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_it_is_ready_when_the_database_and_redis_answer(anonymous_api: Api) -> None:
    response = anonymous_api.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok" and body["failed"] == []
    assert body["checks"]["database"] == body["checks"]["redis"] == "ok"


def test_it_is_not_ready_and_says_redis_when_redis_is_down(anonymous_api: Api, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    response = anonymous_api.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["failed"]) == ("unavailable", ["redis"])
    assert body["checks"]["redis"].startswith("error: ConnectionError")
    assert body["checks"]["database"] == "ok"


def test_it_checks_a_separate_broker_on_its_own(anonymous_api: Api, settings: Any) -> None:
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    body = anonymous_api.get("/readyz").json()
    assert body["failed"] == ["broker"]
    assert body["checks"]["redis"] == "ok"


def test_it_is_not_ready_and_says_database_when_the_database_fails(anonymous_api: Api,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr("xmc.ops.check_database", broken)
    response = anonymous_api.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["database"]
    assert response.json()["checks"]["database"] == "error: OperationalError: connection refused"


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_it_counts_rest_calls_per_rpc_and_code_and_times_them(world: World, alice_api: Api, bob_api: Api,
                                                               anonymous_api: Api) -> None:
    ok = {"transport": "rest", "service": ESS, "method": "GetExperiment", "code": "OK"}
    denied = {**ok, "code": "PERMISSION_DENIED"}
    timing = {"transport": "rest", "service": ESS, "method": "GetExperiment"}
    before = (_sample("xmc_rpc_requests_total", **ok), _sample("xmc_rpc_requests_total", **denied),
              _sample("xmc_rpc_duration_seconds_count", **timing))

    assert alice_api.get(f"/v1/experiments/{world.xid}").status_code == 200
    assert alice_api.get(f"/v1/experiments/{world.xid}").status_code == 200
    assert bob_api.get(f"/v1/experiments/{world.xid}").status_code == 403

    after = (_sample("xmc_rpc_requests_total", **ok), _sample("xmc_rpc_requests_total", **denied),
             _sample("xmc_rpc_duration_seconds_count", **timing))
    assert [a - b for a, b in zip(after, before)] == [2, 1, 3]

    scrape = anonymous_api.get("/metrics")
    assert scrape.status_code == 200
    assert scrape["Content-Type"].startswith("text/plain")
    text = scrape.content.decode()
    assert ('xmc_rpc_requests_total{code="OK",method="GetExperiment",'
            f'service="{ESS}",transport="rest"}}') in text
    assert "xmc_rpc_duration_seconds_bucket{" in text



def test_it_serves_the_favicon_browsers_ask_every_page_for(client: Any, settings: Any) -> None:
    settings.ROOT_URLCONF = "xmc.urls"  # the whole site, not the API's URLconf of these tests
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/svg+xml"
    assert response.content.startswith(b"<svg")
    # The pages link the same icon, so no browser asks a 404 for it.
    for page in ("/login", "/api/cli/signin"):
        assert b'rel="icon" href="/static/xmc/favicon.svg"' in client.get(page).content, page


def _waiting_create(seconds: float) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from tests import factories
    from workunits import services
    from workunits.models import Operation

    exp = factories.experiment()
    create = services.create_work_unit(exp.id, factories.work_unit_message()).id
    Operation.objects.filter(id=create).update(create_time=timezone.now() - timedelta(seconds=seconds))


def test_it_says_delivery_is_ok_while_workers_keep_up(anonymous_api: Api) -> None:
    body = anonymous_api.get("/readyz").json()
    assert body["delivery"]["status"] == "ok" and body["delivery"]["oldestPendingSeconds"] == 0.0


def test_it_says_delivery_is_degraded_and_stays_ready_when_work_waits(anonymous_api: Api, settings: Any) -> None:
    settings.XMC_DEGRADED_AFTER_S = 120
    _waiting_create(240)
    response = anonymous_api.get("/readyz")
    assert response.status_code == 200  # the web can still serve
    delivery = response.json()["delivery"]
    assert delivery["status"] == "degraded"
    assert 239 < delivery["oldestPendingSeconds"] < 260
    assert delivery["queues"]["actuator"] == delivery["oldestPendingSeconds"]


def test_it_serves_the_oldest_pending_gauge_per_queue(anonymous_api: Api) -> None:
    _waiting_create(90)
    text = anonymous_api.get("/metrics").content.decode()
    line = next(l for l in text.splitlines() if l.startswith('xmc_delivery_oldest_pending_seconds{queue="actuator"}'))
    assert 89 < float(line.rsplit(" ", 1)[1]) < 120
    assert 'xmc_delivery_oldest_pending_seconds{queue="lifecycle"} 0.0' in text
