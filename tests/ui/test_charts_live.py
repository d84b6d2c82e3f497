"""Charts live: the write path's commit publishes one coalesced "metrics" message, and the streams carry it.

Points go through ``metrics.services.write_points`` (and, over HTTP, through the
real ``metrics:write`` endpoint on uvicorn); the message goes through real Redis
(``ui.live.publish_metrics``, registered into ``metrics.hooks.written_hooks``)
to the web process's one subscription and the open stream.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
import requests
from django.conf import settings
from django.utils import timezone

from metrics import hooks, services, tokens
from tests import factories
from tests.ui.asgi_server import asgi_server  # noqa: F401 - fixture
from tests.ui.test_events import _open
from ui import live
from workunits.models import WorkUnitExecution
from xmc.auth.tokens import issue_token

ALICE = "alice@example.com"


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> live._MetricsGate:
    """A fresh publisher memo (this process's), so earlier tests' publishes do not hold this one's back."""
    fresh = live._MetricsGate()
    monkeypatch.setattr(live, "_gate", fresh)
    return fresh


@pytest.fixture
def channel() -> Iterator[Any]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(live.channel())
    while pubsub.get_message(timeout=1.0) is None and not pubsub.subscribed:
        pass
    yield pubsub
    pubsub.close()


def _messages(pubsub: Any, wait: float) -> list[str]:
    out, deadline = [], time.monotonic() + wait
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.05)
        if message and message["type"] == "message":
            out.append(message["data"].decode())
    return out


def _execution(exp: Any, wid: int = 1) -> WorkUnitExecution:
    return WorkUnitExecution.objects.get(work_unit__experiment=exp, work_unit__wid=wid, eid=1)


def _points(start: int, n: int) -> list[services.Point]:
    now = timezone.now()
    return [services.Point("loss", s, 1.0 / (s + 1), now + timedelta(milliseconds=s)) for s in range(start, start + n)]


def _after_hello(reader: Any) -> list[str]:
    """The events a stream sent after its "hello" (before it: the replay of the log, which may hold
    earlier runs' changes of an experiment with the same id)."""
    names = [e[1] for e in reader.events]
    return names[names.index("hello") + 1:]


@pytest.mark.django_db
def test_it_hears_of_new_points_through_the_metrics_hook() -> None:
    assert live.publish_metrics in hooks.written_hooks  # ui.apps.UiConfig.ready registered it


@pytest.mark.django_db
def test_it_publishes_one_message_per_work_unit_per_window_for_a_write_and_none_for_a_replay(
        gate: live._MetricsGate, channel: Any) -> None:
    exp = factories.experiment(creator=ALICE)
    factories.work_unit(exp, wid=1)
    factories.work_unit(exp, wid=2)
    first, second = _execution(exp, 1), _execution(exp, 2)
    assert services.write_points(first.pk, _points(0, 10)) == 10
    for i in range(1, 5):  # a burst within the window: held back
        services.write_points(first.pk, _points(i * 10, 10))
    services.write_points(second.pk, _points(0, 3))  # another work unit has its own window
    got = [m.split(" ", 1) for m in _messages(channel, 0.5)]
    assert [m[0] for m in got] == [live.EPHEMERAL, live.EPHEMERAL]  # not in the replay log: no id
    assert [json.loads(m[1]) for m in got] == [{"kind": "metrics", "xid": exp.id, "wid": 1, "eid": 1},
                                               {"kind": "metrics", "xid": exp.id, "wid": 2, "eid": 1}]
    time.sleep(live.METRICS_WINDOW_S + 0.1)
    assert services.write_points(first.pk, _points(0, 10)) == 0  # a replay adds nothing: no message
    assert _messages(channel, 0.3) == []
    services.write_points(first.pk, _points(100, 1))  # new points after the window: a new message
    assert len(_messages(channel, 0.5)) == 1


@pytest.mark.django_db
def test_it_publishes_one_message_for_each_work_unit_of_one_write_for_many(
        gate: live._MetricsGate, channel: Any) -> None:
    exp = factories.experiment(creator=ALICE)
    units = [factories.work_unit(exp, wid=wid) for wid in (1, 2, 3)]
    executions = [_execution(exp, unit.wid) for unit in units]
    # The system metrics' collector writes for every running execution at once.
    assert services.write_points_many([(e.pk, _points(0, 4)) for e in executions]) == 12
    got = sorted((json.loads(m.split(" ", 1)[1]) for m in _messages(channel, 0.5)), key=lambda e: e["wid"])
    assert got == [{"kind": "metrics", "xid": exp.id, "wid": wid, "eid": 1} for wid in (1, 2, 3)]
    assert services.write_points_many([(e.pk, _points(4, 1)) for e in executions]) == 3  # within the window
    assert _messages(channel, 0.3) == []


@pytest.mark.django_db
def test_it_waits_for_another_process_holding_the_gate_only_until_the_gate_opens(
        gate: live._MetricsGate, channel: Any) -> None:
    exp = factories.experiment(creator=ALICE)
    factories.work_unit(exp, wid=1)
    execution = _execution(exp)
    # Another web process published 0.8 s ago: the shared gate has 0.2 s left.
    redis.Redis.from_url(settings.REDIS_URL).set(live.metrics_gate(exp.id, 1), "1", px=200)
    services.write_points(execution.pk, _points(0, 1))
    assert _messages(channel, 0.1) == []
    time.sleep(0.25)
    services.write_points(execution.pk, _points(1, 1))  # not held back for a whole window by this process's memo
    assert len(_messages(channel, 0.3)) == 1


@pytest.mark.django_db
def test_it_never_fails_nor_slows_the_write_path_when_redis_is_down(gate: live._MetricsGate, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    exp = factories.experiment(creator=ALICE)
    factories.work_unit(exp, wid=1)
    execution = _execution(exp)
    assert services.write_points(execution.pk, _points(0, 5)) == 5
    assert gate.quiet_until > time.monotonic()  # it backs off instead of trying on every batch
    started = time.monotonic()
    for i in range(1, 20):
        assert services.write_points(execution.pk, _points(i * 5, 5)) == 5
    assert time.monotonic() - started < 2.0


@pytest.mark.django_db(transaction=True)
def test_it_brings_metrics_from_the_http_write_path_to_an_open_stream_that_asks_for_them(
        asgi_server: str, gate: live._MetricsGate) -> None:  # noqa: F811
    exp = factories.experiment(creator=ALICE)
    factories.work_unit(exp, wid=1)
    factories.work_unit(exp, wid=2)
    bearer = {"Authorization": f"Bearer {issue_token(ALICE)}"}
    write_url = f"{asgi_server}/v1/experiments/{exp.id}/workUnits/1/metrics:write"
    metrics_token = {"Authorization": f"Bearer {tokens.token_for(exp.id, 1, 1)}"}
    for charts in _open(f"{asgi_server}/experiments/{exp.id}/events?wid=1&metrics=1", **bearer):
        for plain in _open(f"{asgi_server}/experiments/{exp.id}/events", **bearer):
            started = time.monotonic()
            answer = requests.post(write_url, json={"points": [{"metric": "loss", "step": 1, "value": 0.5}]},
                                   headers=metrics_token, timeout=10)
            assert answer.status_code == 200 and answer.json() == {"written": 1, "duplicates": 0}
            event_id, name, data, arrived = charts.wait_for("metrics", timeout=10)
            assert event_id == "" and json.loads(data) == {"kind": "metrics", "xid": exp.id, "wid": 1, "eid": 1}
            assert arrived - started < 5.0
            time.sleep(0.3)
            assert _after_hello(plain) == []  # the experiment page and `xmc watch` never see them
            assert _after_hello(charts) == ["metrics"]  # and no roll-up refresh for points
    # The list stream (a dashboard's) carries another work unit's points, for the experiments it
    # shows; a stream of work unit 1, open on the same server, does not.
    for charts in _open(f"{asgi_server}/experiments/{exp.id}/events?wid=1&metrics=1", **bearer):
        for board in _open(f"{asgi_server}/experiments/events?x={exp.id}&metrics=1", **bearer):
            services.write_points(_execution(exp, 2).pk, _points(0, 3))
            assert json.loads(board.wait_for("metrics", timeout=10)[2])["wid"] == 2
            time.sleep(0.3)  # the same message, fanned out to both streams at once, has had its time
            assert _after_hello(charts) == []
