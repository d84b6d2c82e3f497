"""The REST edge while Postgres or Redis is down: 503 UNAVAILABLE fast, /readyz 503, back by itself;
creates, stops and restarts still answer OK while Redis is down (the outbox carries them)."""
from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client
from google.protobuf import json_format

from tests import factories
from tests.k8s_bridge.actuator.conftest import REAL_DELIVER_COMMITTED  # imported before any test patches it
from tests.api.rest.conftest import ALICE, Api
from tests.workunits.delivery.outages import database_down
from tests.ports import free_port
from workunits.models import Operation
from xmc.celery import app

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("mode", ["refused", "stalled"])
def test_it_answers_503_fast_and_readyz_says_so_while_postgres_is_down(settings: Any, mode: str) -> None:
    exp = factories.experiment(ALICE)
    api = Api(ALICE)
    newcomer = Api("someone-new@example.com")  # no identity cached for this one
    assert api.get(f"/v1/experiments/{exp.id}").status_code == 200
    with database_down(mode):
        for call in (lambda: api.get(f"/v1/experiments/{exp.id}"),
                     lambda: api.post(f"/v1/experiments/{exp.id}/workUnits",
                                      json_format.MessageToDict(factories.work_unit_message())),
                     lambda: newcomer.get("/v1/experiments")):
            started = time.monotonic()
            response = call()
            took = time.monotonic() - started
            assert response.status_code == 503, response.content
            assert response.json()["error"]["status"] == "UNAVAILABLE"
            assert response["Retry-After"]
            assert took < settings.XMC_DB_CONNECT_TIMEOUT_S + 3, f"{took:.1f} s"
        ready = Client().get("/readyz")
        assert ready.status_code == 503 and ready.json()["failed"] == ["database"]
        from django.test import override_settings

        with override_settings(ROOT_URLCONF="xmc.urls"):  # any other page: 503, not a 500
            browser = Client()
            browser.cookies["sessionid"] = "a" * 32  # a signed-in operator's session: read from the database
            page = browser.get("/admin/")
            assert page.status_code == 503 and b"database unavailable" in page.content
    # Back by itself: the next call reconnects.
    assert api.get(f"/v1/experiments/{exp.id}").status_code == 200
    assert Client().get("/readyz").status_code == 200


def _use_broker(url: str | None) -> None:
    from kombu import pools as kombu_pools

    app.pool.force_close_all()
    app.conf.broker_url = url
    app.conf.broker_write_url = url
    app._pool = None
    app.amqp._producer_pool = None
    kombu_pools.reset()


def test_it_commits_creates_stops_and_restarts_and_answers_ok_while_redis_is_down(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("workunits.outbox.deliver_committed", REAL_DELIVER_COMMITTED)  # really publish
    exp = factories.experiment(ALICE)
    factories.work_unit(exp)
    factories.work_unit(exp)
    api = Api(ALICE)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    old = app.conf.broker_url
    settings.REDIS_URL = dead
    settings.XMC_RATE_LIMIT_PER_S = 5.0  # on, against the dead Redis: fails open
    _use_broker(dead)
    try:
        started = time.monotonic()
        created = api.post(f"/v1/experiments/{exp.id}/workUnits", json_format.MessageToDict(factories.work_unit_message()))
        stopped = api.post(f"/v1/experiments/{exp.id}/workUnits/1:stop", {})
        restarted = api.post(f"/v1/experiments/{exp.id}/workUnits/2:restart", {})
        took = time.monotonic() - started
    finally:
        _use_broker(old)
    assert [r.status_code for r in (created, stopped, restarted)] == [200, 200, 200], \
        [r.content for r in (created, stopped, restarted)]
    assert took < 15, f"{took:.1f} s"
    names = [r.json()["name"] for r in (created, stopped, restarted)]
    ops = Operation.objects.filter(id__in=[int(n.rsplit("/", 1)[1]) for n in names])
    assert {op.task_type for op in ops} == {"CREATE", "DELETE", "RESTART"}
    assert all(not op.done and op.dispatched_time is None for op in ops)  # in the outbox, for the sweep
    # The web pages still render without Redis.
    from django.test import override_settings

    with override_settings(ROOT_URLCONF="xmc.urls"):
        _use_broker(dead)
        try:
            assert Client().get("/admin/login/").status_code == 200
        finally:
            _use_broker(old)
