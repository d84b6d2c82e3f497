"""Real receivers for the notification tests, and a pump that runs the notifications queue inline.

* :class:`Receiver`: an HTTP server on loopback that verifies every request
  with the ``standardwebhooks`` library (the spec's reference implementation
  for Python) and records it; it can answer 500, hang, or be down.
* ``smtp``: a real SMTP server (aiosmtpd) collecting the emails.
* ``outbox``: what the services hand to the ``notifications`` queue, recorded
  instead of sent; :meth:`Outbox.pump` runs those tasks inline until nothing is
  left (time can be moved forward for retries and coalescing windows).
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from notifications import outbox as notify_outbox
from notifications import services


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    verified: bool
    error: str = ""
    path: str = ""

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    requests: list[Received] = field(default_factory=list)
    secret: str | None = None
    #: Status codes to answer, in order (then 200).
    statuses: list[int] = field(default_factory=list)
    #: Seconds to hang before answering the next request (then 0).
    hang_s: float = 0.0
    #: Paths answered 500 every time (one subscriber's broken receiver on a shared host).
    failing_paths: set[str] = field(default_factory=set)
    port: int = 0
    server: ThreadingHTTPServer | None = None
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                verified, error = False, ""
                if receiver.secret and "webhook-signature" in headers:
                    try:
                        Webhook(receiver.secret).verify(body, headers)
                        verified = True
                    except WebhookVerificationError as exc:
                        error = str(exc)
                receiver.requests.append(Received(headers, body, verified, error, self.path))
                if receiver.hang_s:
                    hang, receiver.hang_s = receiver.hang_s, 0.0
                    receiver.released.wait(hang)  # stop() ends the hang
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if self.path.split("?", 1)[0] in receiver.failing_paths:
                    status = 500
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # batches send several at a time: the default backlog of 5 refuses some
            # stop() waits for the handler threads (a hanging one included), so none outlives its
            # test and writes into a closed connection while a later test runs.
            daemon_threads = False
            block_on_close = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A sender that gave up (its timeout, in the hang tests) closes the connection
                # before the answer: expected here, and a printed traceback from this thread
                # would race other threads' ast.parse on CPython 3.11 (gh-106905).
                pass

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    settings.XMC_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.XMC_RATE_LIMIT_PER_S = 0
    settings.XMC_NOTIFY_COALESCE_S = 0.0


class _Sink:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.recipients: list[list[str]] = []
        #: Addresses the server refuses (550), e.g. one subscriber's full mailbox.
        self.refuse: set[str] = set()

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,  # noqa: N802
                          rcpt_options: list[str]) -> str:
        if address in self.refuse:
            return "550 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append(message_from_bytes(envelope.content))
        self.recipients.append(sorted(envelope.rcpt_tos))
        return "250 OK"


@dataclass
class Smtp:
    sink: _Sink
    port: int

    @property
    def messages(self) -> list[Message]:
        return self.sink.messages

    @property
    def refuse(self) -> set[str]:
        return self.sink.refuse

    @property
    def recipients(self) -> list[list[str]]:
        """The envelope recipients of each message (To and Bcc)."""
        return self.sink.recipients


@pytest.fixture
def smtp(settings: Any) -> Iterator[Smtp]:
    sink = _Sink()
    import socket

    with socket.socket() as probe:  # aiosmtpd's ready check connects to the port it was given
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    yield Smtp(sink, port)
    controller.stop()


class Outbox:
    """The notifications queue, recorded; :meth:`pump` runs it inline."""

    def __init__(self) -> None:
        self.fan_outs: list[int] = []
        self.deliveries: list[int] = []

    def pump(self, *, rounds: int = 50, now: Any = None) -> None:
        for _ in range(rounds):
            if not self.fan_outs and not self.deliveries:
                return
            fan, self.fan_outs = self.fan_outs, []
            services.fan_out_many(fan, now=now)  # as the fan-out task does: one call per batch
            todo, self.deliveries = self.deliveries, []
            for did in todo:
                services.deliver(did, now=now)


@pytest.fixture
def outbox(monkeypatch: pytest.MonkeyPatch) -> Outbox:
    box = Outbox()
    monkeypatch.setattr(services, "enqueue", lambda ids, countdown=None: box.deliveries.extend(ids))
    monkeypatch.setattr(notify_outbox, "enqueue", lambda ids, countdown=None: box.deliveries.extend(ids))
    monkeypatch.setattr(services, "enqueue_fan_out", lambda ids: box.fan_outs.extend(ids))
    monkeypatch.setattr(notify_outbox, "enqueue_fan_out", lambda ids: box.fan_outs.extend(ids))
    # The test's transaction never commits: record at once what would be enqueued after commit.
    monkeypatch.setattr(notify_outbox, "after_commit", lambda callback: callback())
    return box
