"""The pages' event streams through a real ASGI server: a committed transition reaches an open stream.

uvicorn serves ``xmc.asgi:application``; the transition is committed by the
services and handed to the committed hooks as the reconciler does, so it
goes through Redis (``ui.live.publish``) and the web process's one
subscription to the open stream.
"""
from __future__ import annotations

from typing import Any

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from tests import factories
from tests.ui import pages
from tests.ui.asgi_server import asgi_server  # noqa: F401 - fixture
from ui import live
from xmc.auth.tokens import issue_token

pytestmark = pytest.mark.django_db(transaction=True)

ALICE, BOB = "alice@example.com", "bob@example.com"


class Reader(threading.Thread):
    """Reads an SSE response line by line into ``events`` as (id, event, data, arrival time)."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(daemon=True)
        self.response = response
        self.events: list[tuple[str, str, str, float]] = []
        self.opened = threading.Event()

    def run(self) -> None:
        current: dict[str, str] = {}
        try:
            for raw in self.response.iter_lines(chunk_size=1, decode_unicode=True):
                self.opened.set()
                if raw == "":
                    if "event" in current:
                        self.events.append((current.get("id", ""), current["event"], current.get("data", ""),
                                            time.monotonic()))
                    current = {}
                elif not raw.startswith(":"):
                    key, _, value = raw.partition(":")
                    current[key] = value.strip()
        except Exception:  # the test closed the response
            return

    def wait_for(self, name: str, timeout: float = 30.0) -> tuple[str, str, str, float]:
        """The first ``name`` event (at once when it came already); the timeout is generous, a
        loaded machine's, since the wait ends at the event."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if event[1] == name:
                    return event
            time.sleep(0.01)
        raise AssertionError(f"no {name!r} event in {timeout} s; got {[e[1] for e in self.events]}")

    def close(self) -> None:
        """Hang up now (:func:`hang_up`) and let this thread end."""
        hang_up(self.response)
        self.join(timeout=5)


def hang_up(response: requests.Response) -> None:
    """Close a streamed response's connection now, as a browser leaving the page does.

    ``response.close()`` alone leaves the socket open (the pool's connection still holds it): the
    server goes on streaming until its next heartbeat (``ui.events.HEARTBEAT_S``), and a reader
    thread blocked in a read keeps the close waiting for the read timeout (10 s). Shutting the
    socket down first ends both at once.
    """
    sock = getattr(getattr(response.raw, "_connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # the server hung up first
            pass
    response.close()


def _open(url: str, **headers: str) -> Iterator[Reader]:
    response = requests.get(url, headers={"Accept": "text/event-stream", **headers}, stream=True, timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    reader = Reader(response)
    reader.start()
    try:
        reader.wait_for("hello")
        yield reader
    finally:
        reader.close()


def test_it_delivers_a_committed_transition_to_an_open_stream_within_a_second(asgi_server: str) -> None:
    exp = factories.experiment(creator=ALICE)
    factories.work_unit(exp)
    token = issue_token(ALICE)
    for reader in _open(f"{asgi_server}/experiments/{exp.id}/events", Authorization=f"Bearer {token}"):
        started = time.monotonic()
        pages.move(exp.id, 1, 1, "SCHEDULING")
        event_id, name, data, arrived = reader.wait_for("wu-1")
        assert arrived - started < 1.0
        assert '"new":"SCHEDULING"' in data and event_id
        assert reader.wait_for("experiment")[2] == f'{{"xid":{exp.id}}}'


def test_it_delivers_a_committed_study_change_to_its_experiments_stream_not_to_a_units_or_the_lists(
        asgi_server: str) -> None:
    """A study's committed change (here ``:stop``, through ``studies.hooks``) is ``study-<sid>`` on the
    experiment's stream at once, and in the replay log; it is no work unit's change and no list row's."""
    from studies import services as study_services
    from tests.ui.test_study_page import make_study

    study = make_study(trials=())
    xid = study.experiment_id
    token = issue_token(ALICE)
    since = live.top_id()  # what the page was rendered with: older entries of the log are not this test's
    auth = {"Authorization": f"Bearer {token}"}
    for whole, unit, listing in zip(_open(f"{asgi_server}/experiments/{xid}/events?since={since}", **auth),
                                    _open(f"{asgi_server}/experiments/{xid}/events?wid=1&since={since}", **auth),
                                    _open(f"{asgi_server}/experiments/events?x={xid}&since={since}", **auth)):
        started = time.monotonic()
        study_services.stop_study(xid, study.id)
        event_id, _, data, arrived = whole.wait_for(f"study-{study.id}")
        assert arrived - started < 1.0 and event_id
        assert data == f'{{"kind":"study","xid":{xid},"study":{study.id}}}'
        pages.move(xid, 1, 1, "SCHEDULING")  # a later change: each stream has had the study's by then
        unit.wait_for("experiment")  # the move's last event, on each stream that gets it
        whole.wait_for("experiment")
        listing.wait_for(f"x-{xid}")
        assert [e[1] for e in whole.events if e[1] not in ("hello",)] == [f"study-{study.id}", "wu-1", "experiment"]
        assert [e[1] for e in unit.events if e[1] != "hello"] == ["wu-1", "experiment"]
        assert [e[1] for e in listing.events if e[1] != "hello"] == [f"x-{xid}"]
    for again in _open(f"{asgi_server}/experiments/{xid}/events", **auth, **{"Last-Event-ID": since}):
        assert [e[1] for e in again.events][:3] == [f"study-{study.id}", "wu-1", "experiment"]


def test_it_replays_what_a_reconnecting_stream_missed_from_last_event_id(asgi_server: str) -> None:
    exp = factories.experiment(creator=ALICE)
    factories.work_unit(exp)
    token = issue_token(ALICE)
    since = live.top_id()
    pages.move(exp.id, 1, 1, "SCHEDULING", "STARTING")
    for reader in _open(f"{asgi_server}/experiments/{exp.id}/events", Authorization=f"Bearer {token}",
                        **{"Last-Event-ID": since}):
        states = [e[2] for e in reader.events if e[1] == "wu-1"]
        assert len(states) == 2 and '"new":"SCHEDULING"' in states[0] and '"new":"STARTING"' in states[1]


def test_it_tells_a_page_to_reload_when_the_log_no_longer_reaches_back(asgi_server: str) -> None:
    exp = factories.experiment(creator=ALICE)
    token = issue_token(ALICE)
    factories.work_unit(exp)
    pages.move(exp.id, 1, 1, "SCHEDULING")
    for reader in _open(f"{asgi_server}/experiments/{exp.id}/events", Authorization=f"Bearer {token}",
                        **{"Last-Event-ID": "1-0"}):
        assert reader.wait_for("reload")


def test_it_answers_404_to_a_stranger_and_401_without_credentials(asgi_server: str) -> None:
    exp = factories.experiment(creator=BOB)
    stranger = requests.get(f"{asgi_server}/experiments/{exp.id}/events",
                            headers={"Authorization": f"Bearer {issue_token(ALICE)}"}, timeout=10)
    assert stranger.status_code == 404
    assert requests.get(f"{asgi_server}/experiments/{exp.id}/events", timeout=10).status_code == 401


def test_it_keeps_serving_the_rest_api_and_pages_on_the_threaded_wsgi_side(asgi_server: str) -> None:
    exp = factories.experiment(creator=ALICE, title="over asgi")
    token = issue_token(ALICE)
    api = requests.get(f"{asgi_server}/v1/experiments/{exp.id}", headers={"Authorization": f"Bearer {token}"},
                       timeout=10)
    assert api.status_code == 200 and api.json()["title"] == "over asgi"
    assert requests.get(f"{asgi_server}/healthz", timeout=10).status_code == 200
    assert requests.get(f"{asgi_server}/experiments", allow_redirects=False, timeout=10).status_code == 302


def test_it_holds_no_database_connection_while_streams_are_open(asgi_server: str) -> None:
    from django.db import connection

    exp = factories.experiment(creator=ALICE)
    token = issue_token(ALICE)

    def sessions() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            return int(cursor.fetchone()[0])

    before = sessions()
    responses = []
    try:
        for _ in range(5):
            response = requests.get(f"{asgi_server}/experiments/{exp.id}/events", stream=True, timeout=10,
                                    headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 200
            next(response.iter_lines())  # the stream has started: the checks are done
            responses.append(response)
        assert sessions() <= before + 1  # at most the server's pool thread of the last check, closing
    finally:
        for response in responses:
            hang_up(response)


def test_it_answers_404_to_a_stranger_and_401_without_credentials_on_the_logs_follow_stream(asgi_server: str) -> None:
    exp = factories.experiment(creator=BOB)
    factories.work_unit(exp)
    url = f"{asgi_server}/experiments/{exp.id}/workUnits/1/logs/follow"
    assert requests.get(url, headers={"Authorization": f"Bearer {issue_token(ALICE)}"}, timeout=10).status_code == 404
    assert requests.get(url, timeout=10).status_code == 401
    # The owner's request gets past the checks; no cluster answers in this test: 503, never 500.
    owner = requests.get(url, headers={"Authorization": f"Bearer {issue_token(BOB)}"}, timeout=30)
    assert owner.status_code == 503, owner.text


def test_it_sends_only_lines_after_the_page_as_escaped_html_on_the_logs_follow_stream_then_ends() -> None:
    import asyncio
    import threading

    from k8s_bridge.logs.service import LogLine
    from ui import logfollow

    def line(ts: str, text: str) -> LogLine:
        return LogLine("main-0", "pod", "main", ts, text, "cluster")

    async def frames() -> list[bytes]:
        queue: asyncio.Queue[object] = asyncio.Queue()
        for item in (line("2026-12-02T10:00:01.000000Z", "shown already"),
                     line("2026-12-02T10:00:02.000000Z", "step 2 <b>loss</b> 0.5"),
                     logfollow._END):
            queue.put_nowait(item)
        stop = threading.Event()
        out = [frame async for frame in logfollow._frames(queue, stop, "2026-12-02T10:00:01.000000Z", True, "loss")]
        assert stop.is_set()  # the pump is told to let go of the cluster's stream
        return out

    out = b"".join(asyncio.run(frames())).decode()
    assert "shown already" not in out
    assert ("id: 2026-12-02T10:00:02.000000Z\nevent: line\ndata: <span class=\"hit\"><span class=\"ts\">"
            "2026-12-02T10:00:02.000000Z </span>step 2 &lt;b&gt;<mark>loss</mark>&lt;/b&gt; 0.5\ndata: </span>\n\n") in out
    assert out.endswith("event: end\ndata: {}\n\n")



def test_it_keeps_the_last_line_of_a_follow_when_the_stream_closes_before_sending_it() -> None:
    """The cluster's followed stream may close as the container stops, before its last line went out:
    the log is read once more from the newest line sent, and only what is new reaches the page."""
    import asyncio
    import threading

    from k8s_bridge.logs import slots
    from k8s_bridge.logs.service import LogLine
    from ui import logfollow

    def line(ts: str, text: str) -> LogLine:
        return LogLine("main-0", "pod", "main", ts, text, "cluster")

    # The last line and the exit line share the time of the last progress line, as the simulator's do.
    one, two, last = (line("2026-12-02T10:00:01.000000Z", "step 1"), line("2026-12-02T10:00:02.000000Z", "step 2"),
                      line("2026-12-02T10:00:02.000000Z", "the last line"))
    asked: list[str] = []

    def catch_up(after: str) -> Any:
        asked.append(after)
        return iter([two, last])  # sinceTime is inclusive: the newest line sent comes again

    async def frames() -> list[bytes]:
        queue: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()
        assert slots.acquire("alice@example.com")  # the slot the pump gives back
        threading.Thread(target=logfollow._pump, args=(iter([one, two]), asyncio.get_running_loop(), queue, stop,
                                                       catch_up, "alice@example.com"), daemon=True).start()
        return [frame async for frame in logfollow._frames(queue, stop, "", False, "")]

    out = b"".join(asyncio.run(frames())).decode()
    assert asked == ["2026-12-02T10:00:02.000000Z"]
    assert out.count("step 2") == 1 and "the last line" in out
    assert out.index("the last line") < out.index("event: end")


def test_it_keeps_a_followed_line_with_a_carriage_return_from_breaking_the_event_framing() -> None:
    """A progress bar's ``\\r`` ends an event-stream line too: it must not end the data field early
    (the rest would be read as a field of its own, e.g. an ``event:``)."""
    import asyncio
    import threading

    from k8s_bridge.logs.service import LogLine
    from ui import logfollow

    async def frames() -> list[bytes]:
        queue: asyncio.Queue[object] = asyncio.Queue()
        queue.put_nowait(LogLine("main-0", "pod", "main", "2026-12-02T10:00:03Z", "50%\revent: end", "cluster"))
        queue.put_nowait(logfollow._END)
        return [frame async for frame in logfollow._frames(queue, threading.Event(), "", False, "")]

    out = b"".join(asyncio.run(frames())).decode()
    assert "\r" not in out
    assert 'event: line\ndata: <span class="">50%\ndata: event: end\ndata: </span>\n\n' in out


def test_it_delivers_a_stop_and_a_restart_made_through_the_services_to_an_open_stream(asgi_server: str) -> None:
    from workunits import services

    exp = factories.experiment(creator=ALICE)
    factories.work_unit(exp)
    factories.work_unit(exp)
    token = issue_token(ALICE)
    for reader in _open(f"{asgi_server}/experiments/{exp.id}/events", Authorization=f"Bearer {token}"):
        services.stop_work_units(exp.id, [1], batch=False)
        assert '"new":"STOPPING"' in reader.wait_for("wu-1")[2]
        services.restart_work_units(exp.id, [2], batch=False)
        data = reader.wait_for("wu-2")[2]
        assert '"new":"RESTARTING"' in data and '"eid":2' in data
