"""Request bodies before sign-in cost the server nothing (issue 40, item 4).

The attack as reported: connections that declare a large upload (up to the
64 MiB bound) and never finish it were each read into a web worker's memory
before any authentication, with no read timeout; eight of them held ~475 MiB
until they closed. Played here with raw sockets against the real web process
(gunicorn, the deployed worker class, ``xmc.asgi``), with small budgets and a
short deadline so each answer comes quickly: without credentials a body is cut
off at ``XMC_WEB_PREAUTH_MAX_BODY_BYTES`` (413, before the rest is sent), one
that trickles is answered 408, and the process's budget of unauthenticated
bytes answers 429; a client with a token still sends a large body.
"""
from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.web_server import web_server
from xmc.auth.tokens import issue_token

PREAUTH = 65536
PREAUTH_INFLIGHT = 100_000
#: Routes that read a body without credentials: the sign-in form (WSGI bridge) and an event stream (async path).
ROUTES = ["/api/cli/signin", "/experiments/1/events"]


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = Path(tmp_path_factory.mktemp("web")) / "web.log"
    with django_db_blocker.unblock(), web_server(
            log, XMC_WEB_PREAUTH_MAX_BODY_BYTES=str(PREAUTH), XMC_WEB_PREAUTH_BODY_TIMEOUT_S="1.5",
            XMC_WEB_PREAUTH_INFLIGHT_BYTES=str(PREAUTH_INFLIGHT), XMC_WEB_BODY_TIMEOUT_S="10") as (base, _):
        yield base


def _connect(base: str, method: str, path: str, headers: dict[str, str]) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(head.encode() + b"\r\n")
    return sock


def _answer(sock: socket.socket, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """The response's status, headers and what of its body came before the server closed (or timeout)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _closed(sock: socket.socket, timeout: float = 10.0) -> bool:
    """The server closed the connection (what is left of the body is never read)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize("path", ROUTES)
def test_it_refuses_a_huge_declared_body_without_credentials_before_it_is_sent(server: str, path: str) -> None:
    sock = _connect(server, "POST", path, {"Content-Length": str(64 * 1024 * 1024),
                                           "Content-Type": "application/x-www-form-urlencoded"})
    with sock:
        status, headers, body = _answer(sock)  # not a byte of the body was sent
        assert status == 413 and b"without credentials" in body, body
        assert headers.get("connection") == "close" and _closed(sock)


@pytest.mark.parametrize("path", ROUTES)
def test_it_cuts_off_a_chunked_body_without_credentials_at_the_budget(server: str, path: str) -> None:
    sock = _connect(server, "POST", path, {"Transfer-Encoding": "chunked",
                                           "Content-Type": "application/x-www-form-urlencoded"})
    with sock:
        piece = b"a" * 16384
        for _ in range(PREAUTH // len(piece) + 1):  # one piece past the budget, and the upload never ends
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        status, _, body = _answer(sock)
        assert status == 413 and b"without credentials" in body, body


def test_it_answers_408_to_a_body_that_never_arrives_and_closes_the_connection(server: str) -> None:
    sock = _connect(server, "POST", "/api/cli/signin", {"Content-Length": "1000",
                                                        "Content-Type": "application/x-www-form-urlencoded"})
    with sock:
        sock.sendall(b"username=x")  # 10 of the 1000 bytes, then nothing
        status, headers, body = _answer(sock)
        assert status == 408 and b"not received in time" in body
        assert headers.get("connection") == "close" and _closed(sock)


def test_it_answers_429_by_the_process_budget_of_unauthenticated_bytes(server: str) -> None:
    size = 60_000  # each under the per-request budget; two of them over the process's
    socks = [_connect(server, "POST", "/api/cli/signin", {"Content-Length": str(size + 10),
                                                          "Content-Type": "application/x-www-form-urlencoded"})
             for _ in range(2)]
    try:
        for sock in socks:
            sock.sendall(b"a=" + b"b" * (size - 2))
        ready, _, _ = select.select(socks, [], [], 10)  # whichever pushed the process over: 429 at once
        assert len(ready) == 1, "expected exactly one answer while both uploads are unfinished"
        refused = ready[0]
        status, headers, _ = _answer(refused)
        assert status == 429 and headers.get("retry-after") == "1"
        other = socks[1 - socks.index(refused)]
        other.sendall(b"c" * 10)  # the other finishes, and Django answers it (no CSRF token: 403)
        status, _, _ = _answer(other)
        assert status == 403
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.django_db(transaction=True)
def test_it_takes_a_large_body_from_a_client_with_a_token_and_not_from_one_without(server: str) -> None:
    body = json.dumps({"title": "x" * (1024 * 1024)}).encode()  # 16 times the pre-authentication budget

    def post(headers: dict[str, str]) -> tuple[int, bytes]:
        sock = _connect(server, "POST", "/v1/experiments", {"Content-Length": str(len(body)),
                                                            "Content-Type": "application/json", **headers})
        with sock:
            try:
                sock.sendall(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before the body: the answer is already there
            status, _, answer = _answer(sock)
            return status, answer

    status, answer = post({"Authorization": f"Bearer {issue_token('alice@example.com')}"})
    assert b"without credentials" not in answer and json.loads(answer)["error"]["message"], (status, answer[:300])
    for bad in ({}, {"Authorization": "Bearer not-a-token"}, {"Cookie": "sessionid=forged"}):
        status, answer = post(bad)
        assert status == 413 and b"without credentials" in answer, (bad, answer)
