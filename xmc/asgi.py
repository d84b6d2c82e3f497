"""ASGI entry point of the web process (``gunicorn xmc.asgi:application -k xmc.web_worker.UvicornWorker``).

Two ways in, chosen by path:

* the event streams that apps above register (``xmc.api.extensions.async_paths``:
  the researcher's pages' ``/experiments/.../events``) go to Django's ASGI
  handler, whose async views wait on the event loop: an open stream holds no
  thread, so one process serves hundreds;
* everything else (REST API, admin, login flow, pages, static files, ops)
  goes to the very WSGI application ``gunicorn xmc.wsgi`` served, run in a
  pool of ``XMC_WEB_THREADS`` threads per worker (`xmc.wsgi_bridge`, one
  hand-off between the loop and a thread per request). Django's own ASGI
  handler would run every sync view on one thread
  (``sync_to_async(thread_sensitive=True)``), which made the REST API several
  times slower than ``gunicorn --threads``; the pool keeps today's threaded
  behaviour (``./dev bench api`` compares the two).

Both ways read a request's body through the same `xmc.body_guard.BodyGuard`
first (a deadline, a small budget until the credentials are checked, the
process's byte budgets): Django's own ASGI handler would read any body whole,
with no deadline, before a view runs.

Lifespan events are answered here (nothing to start: the event hub of
``ui.live`` starts with the first stream).
"""
from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xmc.settings")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

django_asgi = get_asgi_application()  # sets Django up: the apps' ready() have registered their paths

from django.conf import settings  # noqa: E402 - configured by the line above

from xmc import wsgi  # noqa: E402 - the same WSGI app (and its deploy checks) as gunicorn xmc.wsgi
from xmc.api import extensions  # noqa: E402
from xmc.auth.credentials import carries_credentials  # noqa: E402
from xmc.body_guard import BodyLimits, guarded  # noqa: E402
from xmc.wsgi_bridge import ThreadedWSGI  # noqa: E402

#: Every body is read under one guard per process (`xmc.body_guard`): deadline, budgets, credentials first.
threaded = ThreadedWSGI(wsgi.application, threads=settings.XMC_WEB_THREADS, limits=BodyLimits.from_settings(),
                        authenticated=carries_credentials)


def is_async_path(path: str) -> bool:
    return any(pattern.match(path) for pattern in extensions.async_paths)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    elif scope["type"] == "http" and is_async_path(scope.get("path", "")):
        await guarded(threaded.guard, django_asgi, scope, receive, send)  # type: ignore[arg-type]
    else:
        await threaded(scope, receive, send)
