"""`xmc.wsgi_bridge`: the WSGI app served from uvicorn's event loop, over real HTTP.

Each test runs a real uvicorn server in a thread with a small WSGI
application of its own, so what is checked is the bridge: the environ it
builds, one hand-off per ordinary request, streams chunk by chunk and
closed when the client goes away, the body bound. The production app under
it is tested through `tests/ui/asgi_server.py` (tests/ui/test_events.py and
the browser tests) and timed by ``./dev bench api --rows rest``.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
import uvicorn

from xmc.body_guard import BodyLimits
from xmc.wsgi_bridge import ThreadedWSGI
from tests.ports import free_port


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[str, ThreadedWSGI]]]:
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: Any, max_body: int = 1 << 20) -> tuple[str, ThreadedWSGI]:
        bridge = ThreadedWSGI(app, threads=4, limits=BodyLimits(max_body=max_body, preauth_body=max_body))
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(bridge, host="127.0.0.1", port=port, log_level="warning",
                                               lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}", bridge

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


class _Response(list):  # what Django's HttpResponse says of itself: not streaming
    streaming = False


def _echo(environ: dict[str, Any], start_response: Callable[..., Any]) -> _Response:
    """Answer the environ's WSGI keys and the body it read, as JSON."""
    body = environ["wsgi.input"].read()
    keys = ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "CONTENT_TYPE", "CONTENT_LENGTH", "HTTP_X_TWICE",
            "HTTP_AUTHORIZATION", "REMOTE_ADDR", "SERVER_PROTOCOL", "wsgi.url_scheme")
    answer = {key: environ.get(key) for key in keys}
    answer["body"] = body.decode()
    start_response("201 Created", [("Content-Type", "application/json"), ("X-Answer", "yes")])
    return _Response([json.dumps(answer).encode()])


def test_it_gives_the_app_the_request_as_wsgi_and_sends_its_answer(serve) -> None:
    base, _ = serve(_echo)
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    conn.putrequest("POST", "/v1/caf%C3%A9/x?a=1&b=%20")
    for name, value in (("Content-Type", "application/json"), ("Content-Length", "7"), ("X-Twice", "one"),
                        ("X-Twice", "two"), ("Authorization", "Bearer t")):
        conn.putheader(name, value)
    conn.endheaders(b'{"a":1}')
    response = conn.getresponse()
    got = json.loads(response.read())
    assert response.status == 201 and response.getheader("X-Answer") == "yes"
    assert got == {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/café/x".encode().decode("latin-1"),
                   "QUERY_STRING": "a=1&b=%20", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": "7",
                   "HTTP_X_TWICE": "one,two", "HTTP_AUTHORIZATION": "Bearer t", "REMOTE_ADDR": "127.0.0.1",
                   "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http", "body": '{"a":1}'}


def test_it_makes_an_ordinary_response_one_hand_off_to_the_pool(serve) -> None:
    base, bridge = serve(_echo)
    submitted = []
    submit = bridge.pool.submit
    bridge.pool.submit = lambda *a, **k: (submitted.append(a[0]), submit(*a, **k))[1]  # type: ignore[method-assign]
    assert requests.post(f"{base}/x", data=b"x" * 200_000, timeout=10).json()["body"] == "x" * 200_000
    assert len(submitted) == 1


def test_it_delivers_a_chunked_request_body_whole(serve) -> None:
    base, _ = serve(_echo)
    answer = requests.post(f"{base}/x", data=(part for part in (b"ab", b"cd", b"ef")), timeout=10)
    assert answer.json()["body"] == "abcdef"


def test_it_refuses_a_body_over_the_bound_before_the_app_runs(serve) -> None:
    calls = []

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> _Response:
        calls.append(environ)
        return _echo(environ, start_response)

    base, _ = serve(app, max_body=1000)
    assert requests.post(f"{base}/x", data=b"x" * 1001, timeout=10).status_code == 413
    chunked = requests.post(f"{base}/x", data=(b"x" * 600 for _ in range(2)), timeout=10)
    assert chunked.status_code == 413
    assert requests.post(f"{base}/x", data=b"x" * 1000, timeout=10).status_code == 201
    assert len(calls) == 1


def test_it_sends_a_streaming_response_chunk_by_chunk_and_closes_it_when_the_client_leaves(serve) -> None:
    produced: list[int] = []
    closed = threading.Event()
    release = threading.Event()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        def chunks() -> Iterator[bytes]:
            try:
                for i in range(1000):
                    produced.append(i)
                    yield f"line {i}\n".encode()
                    if i == 0:
                        release.wait(10)  # the first line must be out before the second is made
                    time.sleep(0.02)
            finally:
                closed.set()

        start_response("200 OK", [("Content-Type", "text/plain")])
        return chunks()  # a generator: not Django's, so it streams

    base, _ = serve(app)
    with requests.get(f"{base}/stream", stream=True, timeout=10) as response:
        lines = response.iter_lines()
        assert next(lines) == b"line 0" and produced == [0]
        release.set()
        assert next(lines) == b"line 1"
    assert closed.wait(10), "the stream went on after its client left"
    assert len(produced) < 1000


def test_it_sends_a_response_started_by_its_first_chunk(serve) -> None:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])  # inside the generator (PEP 3333)
        yield b"late "
        yield b"start"

    def lazy(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        return app(environ, start_response)

    base, _ = serve(lazy)
    assert requests.get(f"{base}/x", timeout=10).text == "late start"
