"""The pages' Server-Sent Events streams (async views: an open stream holds no thread).

``GET /experiments/<xid>/events`` (optionally ``?wid=``) and
``GET /experiments/events?x=1,2,3`` (the list page). Served by Django's ASGI
handler on the event loop (``xmc.asgi`` routes only these paths there). The
caller is the session's user or, for ``xmc watch``, an ``Authorization:
Bearer`` token of the API (``xmc.auth.identity.authenticate_bearer``); the
read check is the API's (``xmc.api.reads``), run once when the stream opens,
and someone else's experiment is 404 as on the pages.

Events (``ui.live`` supplies them from the process's one Redis subscription):

* ``wu-<wid>`` for a state change of that work unit, data ``{"xid", "wid",
  "eid", "old", "new"}``; ``experiment`` (data ``{"xid"}``) after each change
  of the experiment (its roll-up moved); ``x-<xid>`` on the list stream;
* ``study-<sid>`` (experiment streams only), data ``{"kind": "study", "xid",
  "study"}``: a committed change of that study's rows (a trial started,
  completed, failed or was pruned; the study was asked to stop or ended;
  ``ui.live.publish_study``); the study page reads its live part again on it;
* ``metrics`` (only with ``?metrics=1``), data ``{"kind": "metrics", "xid",
  "wid", "eid"}``: that work unit has new metric points (at most about one
  per second per work unit, ``ui.live.publish_metrics``); it has no ``id``:
  it is not in the replay log, and a page reads its charts again on
  ``hello`` instead of having it replayed;
* ``reload``: the page missed events it cannot replay (``Last-Event-ID`` or
  ``since`` older than the log, or its queue overflowed): read everything again;
* ``denied``, the last event: the caller lost read access to the experiment
  (or was deactivated, or their token revoked). Access is checked again
  before every event the stream sends and at least every
  ``XMC_STREAM_RECHECK_S`` seconds (`_recheck`); the list page's stream
  drops the experiments its caller can no longer read and ends only when
  the caller is gone;
* ``hello`` once, at the start, once the process's Redis subscription is
  confirmed (whatever the page reads after it is current), and a comment every
  :data:`HEARTBEAT_S` so proxies keep the connection open.

Each event's ``id`` is its id in the replay log, so a browser's automatic
reconnect (``Last-Event-ID``) resumes where it stopped.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from core.errors import NotFound, PermissionDenied
from experiments.acl import Role
from ui import live, reads
from xmc.api import reads as api_reads
from xmc.auth.identity import Identity, Unauthenticated, authenticate_bearer, identity_for_email

log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
#: "hello" waits at most this long for the process's Redis subscription (the first stream of a process).
HELLO_WAIT_S = 5.0
#: A stream closes after this long; the browser reconnects with Last-Event-ID (bounded memory per stream).
MAX_STREAM_S = 3600.0
#: Streams whose checks run at once. Each check runs in its request's own thread with its own
#: database connection, so a burst of reconnecting pages (a deploy, a network blip) would
#: otherwise open one connection per page at the same moment.
CONCURRENT_CHECKS = 8
_checks: dict[int, asyncio.Semaphore] = {}


def _checks_slot() -> asyncio.Semaphore:
    loop_id = id(asyncio.get_running_loop())
    if loop_id not in _checks:
        _checks[loop_id] = asyncio.Semaphore(CONCURRENT_CHECKS)
    return _checks[loop_id]


def _identity(request: HttpRequest) -> Identity:
    header = request.headers.get("Authorization")
    if header:
        return authenticate_bearer(header)
    user = request.user  # the session's user (AuthenticationMiddleware): one query, here, in this thread
    if not user.is_authenticated or not str(getattr(user, "email", "") or "").strip():
        raise Unauthenticated("sign in, or send Authorization: Bearer <token>")
    return identity_for_email(str(getattr(user, "email", "")))


def _authorize(request: HttpRequest, xid: int | None, wanted: list[int]) -> list[int]:
    """The experiments the stream may show, after the checks; the thread's connections closed after.

    Runs in the request's thread for sync code (``sync_to_async``). A stream
    lasts up to an hour and Django returns a request's database connection
    only when the request finishes: without the close every open stream would
    hold a connection of its own.
    """
    try:
        identity = _identity(request)
        if xid is not None:
            api_reads.require_experiment_role(xid, identity, Role.READER)
            return [xid]
        return reads.readable_xids(identity, wanted)
    finally:
        for connection in connections.all(initialized_only=True):
            connection.close()


def _fresh_identity(request: HttpRequest) -> Identity:
    """The caller as the database says now: a bearer token verified again, a session's user read again."""
    header = request.headers.get("Authorization")
    if header:
        return authenticate_bearer(header)
    user_id = getattr(request.user, "pk", None)
    email = (get_user_model().objects.filter(pk=user_id, is_active=True).values_list("email", flat=True).first()
             if user_id is not None else None)
    if not email:
        raise Unauthenticated("the account is deactivated or gone")
    return identity_for_email(str(email))


def _recheck(request: HttpRequest, xid: int | None, xids: list[int]) -> list[int]:
    """The experiments the open stream may still show; [] when the caller lost everything.

    Runs in a thread (``sync_to_async``), connections closed after, like `_authorize`.
    """
    try:
        try:
            identity = _fresh_identity(request)
        except Unauthenticated:
            return []
        if xid is not None:
            try:
                api_reads.require_experiment_role(xid, identity, Role.READER)
            except (NotFound, PermissionDenied):
                return []
            return [xid]
        return reads.readable_xids(identity, xids)
    finally:
        for connection in connections.all(initialized_only=True):
            connection.close()


Recheck = Callable[[], Awaitable[list[int]]]


def _rechecker(request: HttpRequest, xid: int | None, xids: list[int]) -> Recheck:
    async def recheck() -> list[int]:
        async with _checks_slot():
            return await sync_to_async(_recheck, thread_sensitive=False)(request, xid, xids)

    return recheck


DENIED = b"event: denied\ndata: {}\n\n"


class AccessWatch:
    """When an open stream checks its caller's access again: before what it sends (`allowed`), and
    whenever `due` (``XMC_STREAM_RECHECK_S`` after the last check, events or not)."""

    def __init__(self, recheck: Recheck) -> None:
        self.recheck = recheck
        self.loop = asyncio.get_running_loop()
        self.every = max(0.05, float(settings.XMC_STREAM_RECHECK_S))
        self.next = self.loop.time() + self.every

    def due(self) -> bool:
        return self.loop.time() >= self.next

    def wait_s(self, longest: float) -> float:
        """How long the stream may wait for its next event before a check is due."""
        return min(longest, max(0.0, self.next - self.loop.time()))

    async def allowed(self) -> set[int]:
        """The experiments the caller may still read (empty: access is gone); the next check is due later."""
        found = set(await self.recheck())
        self.next = self.loop.time() + self.every
        return found


def _text(status: int, body: str) -> HttpResponse:
    return HttpResponse(body + "\n", status=status, content_type="text/plain; charset=utf-8")


def _frame(event: str, data: str, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()


async def _stream(scope: live.Scope, since: str, list_page: bool, recheck: Recheck) -> AsyncIterator[bytes]:
    hub = live.hub()
    subscriber = hub.subscribe(scope)  # before the replay: nothing falls between the two
    try:
        yield b"retry: 2000\n\n"
        replay = await sync_to_async(live.replay, thread_sensitive=False)(since, scope)
        if replay.reload:
            yield _frame("reload", "{}", await sync_to_async(live.top_id, thread_sensitive=False)())
            last = None
        else:
            last = since
            for event in replay.events:
                for frame in _frames(event, list_page):
                    yield frame
                last = event.id
            if any(e.kind == "state" for e in replay.events) and not list_page:
                yield _frame("experiment", f'{{"xid":{replay.events[-1].xid}}}', last)
        try:  # "hello" means subscribed: a page that reads again on it misses nothing published after
            await asyncio.wait_for(hub.connected.wait(), timeout=HELLO_WAIT_S)
        except asyncio.TimeoutError:
            pass  # Redis is slow or away: the page still gets its stream, and events once the hub is back
        yield _frame("hello", "{}", None)
        loop = asyncio.get_running_loop()
        closes = loop.time() + MAX_STREAM_S
        watch = AccessWatch(recheck)
        while loop.time() < closes:
            if watch.due() and not await watch.allowed():  # at least every XMC_STREAM_RECHECK_S
                yield DENIED
                return
            if subscriber.stale:
                while not subscriber.queue.empty():
                    subscriber.queue.get_nowait()
                subscriber.stale = False
                yield _frame("reload", "{}", None)
                continue
            try:
                event = await asyncio.wait_for(subscriber.queue.get(), timeout=watch.wait_s(HEARTBEAT_S))
            except asyncio.TimeoutError:
                if not watch.due():
                    yield b": keep-alive\n\n"
                continue
            batch = [event]
            while not subscriber.queue.empty():  # coalesce what arrived together
                batch.append(subscriber.queue.get_nowait())
            allowed = await watch.allowed()  # before every event sent: access may be gone since the last
            if not allowed:
                yield DENIED
                return
            batch = [e for e in batch if e.xid in allowed]
            states = [e for e in batch if not e.ephemeral and (
                last is None or last == "0-0" or live.stream_key(e.id) > live.stream_key(last))]  # else replayed
            # New points: one "metrics" per work unit of the batch, not in the log (no id: Last-Event-ID stays).
            charts = {(e.xid, e.wid): e for e in batch if e.ephemeral}
            for item in [*states, *charts.values()]:
                for frame in _frames(item, list_page):
                    yield frame
            if any(e.kind == "state" for e in states) and not list_page:  # one roll-up refresh per batch
                yield _frame("experiment", f'{{"xid":{states[-1].xid}}}', states[-1].id)
            if states:
                last = states[-1].id
    finally:
        hub.unsubscribe(subscriber)


def _frames(event: live.Event, list_page: bool) -> list[bytes]:
    if event.ephemeral:
        return [_frame("metrics", event.json(), None)]
    if event.kind == "study":  # the study's page follows it; the list's rows do not show studies
        return [] if list_page else [_frame(f"study-{event.study}", event.json(), event.id)]
    if list_page:
        return [_frame(f"x-{event.xid}", event.json(), event.id)]
    return [_frame(f"wu-{event.wid}", event.json(), event.id)]


def _response(stream: AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"  # nginx and friends: do not buffer the stream
    return response


def _since(request: HttpRequest) -> str:
    return (live.valid_id(request.headers.get("Last-Event-ID"))
            or live.valid_id(request.GET.get("since")) or "0-0")


async def experiment_events(request: HttpRequest, xid: str) -> HttpResponseBase:
    x = int(xid)
    wid_text = request.GET.get("wid", "")
    wid = int(wid_text) if wid_text.isdigit() else None
    try:
        async with _checks_slot():
            await sync_to_async(_authorize)(request, x, [])
    except Unauthenticated as exc:
        return _text(401, str(exc))
    except (NotFound, PermissionDenied):
        return _text(404, "not found")
    scope = live.scope_of([x], wid, metrics=request.GET.get("metrics") == "1")
    return _response(_stream(scope, _since(request), list_page=False, recheck=_rechecker(request, x, [])))


async def experiments_events(request: HttpRequest) -> HttpResponseBase:
    wanted = [int(part) for part in request.GET.get("x", "").split(",") if part.isdigit()][:500]
    try:
        async with _checks_slot():
            xids = await sync_to_async(_authorize)(request, None, wanted)
    except Unauthenticated as exc:
        return _text(401, str(exc))
    scope = live.scope_of(xids, metrics=request.GET.get("metrics") == "1")
    return _response(_stream(scope, _since(request), list_page=True, recheck=_rechecker(request, None, xids)))
