"""The WSGI application served from the event loop, in a pool of threads, with one hand-off per request.

``xmc.asgi`` sends every request that is not an event stream here. A
request's body is read on the loop first, then one call into the pool runs
the WSGI application and, for an ordinary (non-streaming) Django response,
joins its body in that same thread; back on the loop the answer goes out in
two sends. Only a streaming response (``StreamingHttpResponse``, a file)
comes back chunk by chunk, one call into the pool per chunk, so a slow
stream holds its thread, as under ``gunicorn --threads``.

Why not a generic bridge (``a2wsgi``, asgiref's ``WsgiToAsgi``): they wait on
the loop from the worker thread for every ``start_response``, every chunk and
the end of the body (three or more round trips between the thread and the
loop per request, each a wake-up of the other side), which made the REST API
a tenth to a sixth slower than under ``gunicorn xmc.wsgi --threads``
(``./dev bench api --rows rest`` compares the two in one run).

A request body is held in memory. It is read by `xmc.body_guard.BodyGuard`:
a deadline, a small budget before the request's credentials are checked, a
bound of ``XMC_WEB_MAX_BODY_BYTES`` after, and per-process budgets of the
bytes held (408/413/429 before the application runs). The bytes count against
the process until the application has answered. The outer bound is only the
bridge's guard: it is far above what Django itself accepts
(``DATA_UPLOAD_MAX_MEMORY_SIZE``, which the API answers with its own 413
error body).
"""
from __future__ import annotations

import asyncio
import contextvars
import io
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from xmc.body_guard import Authenticated, BodyGuard, BodyLimits, Disconnected, Held, Refused

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_END = object()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class ThreadedWSGI:
    """An ASGI application running ``app`` (WSGI) in a pool of ``threads`` threads."""

    def __init__(self, app: WSGIApp, *, threads: int, limits: BodyLimits,
                 authenticated: Authenticated | None = None) -> None:
        self.app = app
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wsgi")
        self.guard = BodyGuard(limits, authenticated, self.pool)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http", scope["type"]
        held = Held(self.guard)
        try:
            try:
                body = await self.guard.read(scope, receive, held)
            except Disconnected:
                return
            except Refused as refused:
                await refused.send(send)
                return
            loop = asyncio.get_running_loop()
            context = contextvars.copy_context()  # the request's context vars, as the thread's own
            status, headers, content, chunks = await loop.run_in_executor(
                self.pool, context.run, self._run, _environ(scope, body))
        finally:
            held.release()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if chunks is None:
            await send({"type": "http.response.body", "body": content})
            return
        # A stream ends when it does or when the client goes away (noticed at its next chunk): the
        # server's send does not fail on a closed connection, so the disconnect is watched for.
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            while not gone.done():
                chunk = await loop.run_in_executor(self.pool, context.run, chunks.next_or_end)
                if chunk is _END:
                    await send({"type": "http.response.body", "body": b""})
                    break
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            gone.cancel()
            await loop.run_in_executor(self.pool, context.run, chunks.close)

    def _run(self, environ: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes, _Chunks | None]:
        """In a pool thread: call the application; join an ordinary response's body here."""
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return written.append

        written: list[bytes] = []
        result = self.app(environ, start_response)
        streaming = getattr(result, "streaming", True)  # Django's responses say; anything else streams
        if not streaming:
            try:
                content = b"".join([*written, *result])
            finally:
                getattr(result, "close", lambda: None)()
            chunks = None
        else:
            iterator = iter(result)
            first = next(iterator, b"")  # start_response may come with the first chunk (PEP 3333)
            content = b""
            chunks = _Chunks([*written, first], iterator, result)
        status, headers = started
        return (int(status.split(" ", 1)[0]),
                [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers],
                content, chunks)


class _Chunks:
    """A streaming response's chunks: those already made, then the rest; ``close`` closes the response."""

    def __init__(self, first: list[bytes], rest: Iterator[bytes], result: Iterable[bytes]) -> None:
        self.first, self.rest, self.result = first, rest, result

    def next_or_end(self) -> bytes | object:
        """The next chunk (in a pool thread: it may wait), or `_END`."""
        if self.first:
            return self.first.pop(0)
        return next(self.rest, _END)

    def close(self) -> None:
        getattr(self.result, "close", lambda: None)()


def _environ(scope: Scope, body: bytes) -> dict[str, Any]:
    """The WSGI environ of an ASGI HTTP scope (PEP 3333: strings are bytes as latin-1)."""
    script_name = scope.get("root_path", "").encode("utf-8").decode("latin-1")
    path = scope["path"].encode("utf-8").decode("latin-1")
    if script_name and path.startswith(script_name):
        path = path[len(script_name):]
    server = scope.get("server") or ("localhost", 80)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": script_name,
        "PATH_INFO": path,
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 0),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    client = scope.get("client")
    if client:
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = str(client[0]), str(client[1])
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        if name not in ("CONTENT_LENGTH", "CONTENT_TYPE"):
            name = "HTTP_" + name
        value = raw_value.decode("latin-1")
        environ[name] = f"{environ[name]},{value}" if name in environ else value
    return environ
