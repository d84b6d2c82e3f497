"""Request bodies read on the event loop with a deadline and byte budgets, before and after sign-in.

Every request body the web process reads goes through `BodyGuard.read`
(``xmc.asgi``: the WSGI bridge's requests and the async event-stream paths
alike), before any view, middleware or authentication of Django runs. The
attack it stops (issue 40, item 4): bodies were read whole into memory before
anyone was authenticated, with no read timeout, so eight connections that
declared large uploads and never finished them held ~475 MiB of a web worker.

* **Before authentication** a body may be at most ``preauth_body`` bytes
  (``XMC_WEB_PREAUTH_MAX_BODY_BYTES``, 64 KiB: every sign-in form and token
  exchange fits) and must arrive within ``preauth_timeout_s``
  (``XMC_WEB_PREAUTH_BODY_TIMEOUT_S``).
* **A larger body** (declared by ``Content-Length``, or arriving chunked past
  the small budget) is read on only after the request's credentials are
  checked (`authenticated`, in the pool: a bearer token of the API or of
  the metrics writers, or a signed-in session), up to ``max_body``
  (``XMC_WEB_MAX_BODY_BYTES``) within ``timeout_s`` (``XMC_WEB_BODY_TIMEOUT_S``);
  without credentials it is refused at once, before its bytes are read.
* **Per process**: the bytes held by bodies being read and not yet answered
  are bounded, ``preauth_inflight`` (``XMC_WEB_PREAUTH_INFLIGHT_BYTES``) for
  requests not (yet) authenticated and ``inflight``
  (``XMC_WEB_INFLIGHT_BODY_BYTES``) for all.

Answers: 413 (too large, or too large for a request without credentials),
408 (the body did not arrive in time), 429 (the process holds as many body
bytes as it may; ``Retry-After``). Each is plain text and closes the
connection, since the rest of the body is never read.
"""
from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
#: Does this request carry valid credentials? Called with its headers (lower-case names), in a pool thread.
Authenticated = Callable[[dict[str, str]], bool]


@dataclass(frozen=True)
class BodyLimits:
    max_body: int = 64 * 1024 * 1024
    preauth_body: int = 64 * 1024
    timeout_s: float = 120.0
    preauth_timeout_s: float = 15.0
    inflight: int = 256 * 1024 * 1024
    preauth_inflight: int = 16 * 1024 * 1024

    @classmethod
    def from_settings(cls) -> BodyLimits:
        from django.conf import settings

        return cls(max_body=settings.XMC_WEB_MAX_BODY_BYTES, preauth_body=settings.XMC_WEB_PREAUTH_MAX_BODY_BYTES,
                   timeout_s=settings.XMC_WEB_BODY_TIMEOUT_S,
                   preauth_timeout_s=settings.XMC_WEB_PREAUTH_BODY_TIMEOUT_S,
                   inflight=settings.XMC_WEB_INFLIGHT_BODY_BYTES,
                   preauth_inflight=settings.XMC_WEB_PREAUTH_INFLIGHT_BYTES)


class Refused(Exception):
    """The body is not read (on): the answer to send instead."""

    def __init__(self, status: int, text: str, retry_after: int | None = None) -> None:
        super().__init__(text)
        self.status, self.text, self.retry_after = status, text, retry_after

    async def send(self, send: Send) -> None:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.text.encode() + b"\n"})


class Disconnected(Exception):
    """The client went away before its request body arrived."""


class Held:
    """The bytes one request's body holds against the process's budgets; `release` gives them back."""

    def __init__(self, guard: BodyGuard) -> None:
        self.guard, self.bytes, self.authenticated = guard, 0, False

    def add(self, count: int) -> None:
        self.bytes += count
        self.guard.total += count
        if not self.authenticated:
            self.guard.unauthenticated += count

    def promote(self) -> None:
        """The request turned out authenticated: its bytes leave the pre-authentication budget."""
        if not self.authenticated:
            self.authenticated = True
            self.guard.unauthenticated -= self.bytes

    def release(self) -> None:
        self.guard.total -= self.bytes
        if not self.authenticated:
            self.guard.unauthenticated -= self.bytes
        self.bytes = 0


class BodyGuard:
    """Reads request bodies under `BodyLimits`; one per process (its counters are the process's)."""

    def __init__(self, limits: BodyLimits, authenticated: Authenticated | None = None,
                 executor: Executor | None = None) -> None:
        self.limits = limits
        self.authenticated = authenticated
        self.executor = executor
        self.total = 0  # bytes held by the bodies of requests not yet answered ...
        self.unauthenticated = 0  # ... and of those not known to be authenticated

    async def _check(self, scope: Scope) -> bool:
        if self.authenticated is None:
            return True  # no credentials to check: every body may use the whole bound
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, contextvars.copy_context().run, self.authenticated, headers)

    def _refuse_unauthenticated(self) -> Refused:
        return Refused(413, f"Request body too large: at most {self.limits.preauth_body} bytes without credentials "
                            "(sign in, or send Authorization: Bearer <token>).")

    async def read(self, scope: Scope, receive: Receive, held: Held) -> bytes:
        """The whole body, its bytes added to ``held``; `Refused` or `Disconnected` instead."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        started = loop.time()
        declared_text = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), b"")
        declared = int(declared_text) if declared_text.isascii() and declared_text.isdigit() \
            and len(declared_text) <= 19 else 0
        if declared > limits.max_body:
            raise Refused(413, f"Request body too large: at most {limits.max_body} bytes.")
        if declared > limits.preauth_body:
            if not await self._check(scope):
                raise self._refuse_unauthenticated()  # before a byte of it is read
            held.promote()
        parts: list[bytes] = []
        size = 0
        while True:
            deadline = started + (limits.timeout_s if held.authenticated else limits.preauth_timeout_s)
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise Refused(408, "Request body not received in time.") from None
            if message["type"] == "http.disconnect":
                raise Disconnected
            part = message.get("body", b"")
            size += len(part)
            if size > limits.max_body:
                raise Refused(413, f"Request body too large: at most {limits.max_body} bytes.")
            if size > limits.preauth_body and not held.authenticated:
                if not await self._check(scope):
                    raise self._refuse_unauthenticated()
                held.promote()
            held.add(len(part))
            if self.total > limits.inflight or (not held.authenticated
                                                and self.unauthenticated > limits.preauth_inflight):
                raise Refused(429, "The server is reading as many request bodies as it may; retry shortly.",
                              retry_after=1)
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then the connection's own messages (a disconnect)."""
    sent = False

    async def again() -> MutableMapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def guarded(guard: BodyGuard, app: Callable[[Scope, Receive, Send], Awaitable[None]],
                  scope: Scope, receive: Receive, send: Send) -> None:
    """``app`` (an ASGI application that reads the body itself, e.g. Django's) behind the guard."""
    held = Held(guard)
    try:
        body = await guard.read(scope, receive, held)
    except Disconnected:
        return
    except Refused as refused:
        await refused.send(send)
        return
    finally:
        held.release()  # these paths are streams that may stay open for an hour: hold nothing that long
    await app(scope, replaying(body, receive), send)
