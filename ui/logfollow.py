"""The logs panel's Follow: a running container's new lines pushed to the page as Server-Sent Events.

``GET /experiments/<xid>/workUnits/<wid>/logs/follow?eid=&replica=&container=&ts=&q=&after=``
(an async view: ``xmc.asgi`` routes it to Django's ASGI handler, `ui.urls.EVENT_PATHS`).

The caller and the read check are the panel's (``ui.views.log_target``: the
session's user or a bearer token; someone else's experiment is 404). The
stream is the cluster's own ``pods/log?follow=true`` (``k8s_bridge.logs.service``),
read in a thread of its own, because the Kubernetes client blocks; each line
it yields goes to the event loop at once (`_pump`), so a line reaches the page
as soon as the kubelet sends it -- no polling. The thread and the cluster
stream are held for as long as the page follows, so they count against the
process's ``XMC_LOGS_MAX_FOLLOWS`` and the user's fair share of it like the
REST API's follow (``k8s_bridge.logs.slots``): one more gets 429 and the
panel says so.

Events:

* ``line``: one log line as the panel prints it (HTML: escaped text, the
  timestamp span when ``ts=1``, ``<mark>`` around matches of ``q``); its
  ``id`` is the line's timestamp, so a reconnecting browser (``Last-Event-ID``)
  or a page that rendered up to ``after`` gets only what came later;
* ``denied``, the last event: the caller lost read access (the share taken
  back, the account deactivated, the token revoked). Access is checked again
  before every batch of lines sent and at least every ``XMC_STREAM_RECHECK_S``
  (`ui.events.AccessWatch`, as the pages' event streams);
* ``end``: the container stopped or the pod went (the page stops following;
  a Follow toggled on again reads the archive or the next instance). Before
  it, the log is read once more (`_catch_up`, not followed, from the newest
  line sent): a followed stream may close as the container stops, before its
  last lines went out, and the panel would lose them.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from core.errors import NotFound, PermissionDenied, ResourceExhausted, ServiceError
from k8s_bridge.logs import service as logs
from k8s_bridge.logs import slots
from ui import events, views
from xmc.auth.identity import Unauthenticated

log = logging.getLogger(__name__)

#: Lines of the running log read again when the stream opens, to find where the page stopped.
REREAD_LINES = 500
#: What ends a line of an event stream; a log line's carriage return (a progress bar's) is one too.
_LINE_ENDS = re.compile(r"\r\n|\r|\n")
HEARTBEAT_S = 15.0
_END = object()


def _open(request: HttpRequest, xid: int, wid: int) -> tuple[logs.LogStream, Callable[[str], Iterator[logs.LogLine]],
                                                             str]:
    """Check the caller, take a follow slot (theirs: ``k8s_bridge.logs.slots``) and open the cluster's
    stream (in the request's thread): the stream, the catch-up read for its end (see `_catch_up`) and
    whose slot it holds."""
    try:
        identity = events._identity(request)
        _, eid, namespace, replica, container, _ = views.log_target(request, identity, xid, wid)
        who = identity.email
        if not slots.acquire(who):
            raise ResourceExhausted("this server already follows as many logs as it may, or you follow your "
                                    "share of them; turn Follow on again shortly")
        try:
            stream = logs.open_logs(xid, wid, eid, namespace,
                                    logs.LogQuery(replica=replica, container=container, follow=True,
                                                  tail_lines=REREAD_LINES))
        except BaseException:
            slots.release(who)
            raise

        def catch_up(after: str) -> Iterator[logs.LogLine]:
            return _catch_up(xid, wid, eid, namespace, stream.replica, stream.container, after)

        return stream, catch_up, who
    finally:
        for connection in connections.all(initialized_only=True):
            connection.close()  # a followed log may stay open for an hour: hold no connection


def _catch_up(xid: int, wid: int, eid: int, namespace: str, replica: str, container: str,
              after: str) -> Iterator[logs.LogLine]:
    """The replica's log from ``after`` on (inclusive; the frames drop what was sent), read once, not followed."""
    try:
        since = datetime.fromisoformat(after.replace("Z", "+00:00")) if after else None
        stream = logs.open_logs(xid, wid, eid, namespace,
                                logs.LogQuery(replica=replica or None, container=container or None, since=since,
                                              tail_lines=None if since else REREAD_LINES))
        yield from stream.lines
    finally:
        for connection in connections.all(initialized_only=True):
            connection.close()


def _pump(lines: Iterator[logs.LogLine], loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any],
          stop: threading.Event, catch_up: Callable[[str], Iterator[logs.LogLine]] | None, who: str) -> None:
    """Thread body: hand each line to the loop as it arrives, then what the stream's end left out.

    Gives the follow slot back at the end.
    """
    def put(line: logs.LogLine) -> bool:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, line)
        except RuntimeError:  # the event loop is gone (the process is stopping)
            return False
        return True

    last = ""
    try:
        for line in lines:
            if stop.is_set() or not put(line):
                break
            last = line.timestamp or last
        else:
            if catch_up is not None and not stop.is_set():
                for line in catch_up(last):
                    if stop.is_set() or not put(line):
                        break
    except Exception as exc:  # noqa: BLE001 - a broken stream ends the follow, never the process
        log.info("logs.follow_ended", extra={"error": repr(exc)[:200]})
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            close()
        slots.release(who)
        try:
            loop.call_soon_threadsafe(queue.put_nowait, _END)
        except RuntimeError:
            pass


async def _always() -> list[int]:
    return [0]


async def _frames(queue: asyncio.Queue[Any], stop: threading.Event, after: str, timestamps: bool,
                  needle: str, recheck: events.Recheck = _always) -> AsyncIterator[bytes]:
    """The stream's frames; access is checked again (``recheck``, `ui.events._recheck`) before every
    batch of lines sent and at least every ``XMC_STREAM_RECHECK_S``: lost access ends it with ``denied``."""
    floor = after  # the page (or the browser, reconnecting) has every line up to this time
    last = ""  # the newest time sent ...
    at_last: set[str] = set()  # ... and the lines sent at it
    watch = events.AccessWatch(recheck)
    try:
        yield b"retry: 3000\n\n"
        while True:
            if watch.due() and not await watch.allowed():
                yield events.DENIED
                return
            try:
                item = await asyncio.wait_for(queue.get(), timeout=watch.wait_s(HEARTBEAT_S))
            except asyncio.TimeoutError:
                if not watch.due():
                    yield b": keep-alive\n\n"
                continue
            batch = [item]
            while item is not _END and not queue.empty():  # what arrived together: one check for all
                item = queue.get_nowait()
                batch.append(item)
            if not await watch.allowed():  # before every line sent: access may be gone since the last check
                yield events.DENIED
                return
            for item in batch:
                if item is _END:
                    yield b"event: end\ndata: {}\n\n"
                    return
                stamp = item.timestamp
                if stamp:
                    if floor and stamp <= floor:
                        continue  # the page shows it already
                    # Lines may share a timestamp (a container's last lines are often written in the same
                    # microsecond as its exit line): only a line already sent is dropped, never its
                    # neighbour of the same time -- that was how the last line went missing.
                    if stamp < last or (stamp == last and item.text in at_last):
                        continue
                    if stamp != last:
                        last, at_last = stamp, set()
                    at_last.add(item.text)
                # The line's own newline stays: each line of the HTML is a data field of its own, and
                # the browser joins them with a newline again (the SSE spec), so the <pre> keeps its lines.
                html = views.log_line_html(item, needle=needle, timestamps=timestamps)
                head = f"id: {item.timestamp}\n" if item.timestamp else ""
                data = "".join(f"data: {part}\n" for part in _LINE_ENDS.split(html))
                yield f"{head}event: line\n{data}\n".encode()
    finally:
        stop.set()  # the thread leaves at the next line, or when the cluster's idle timeout ends the read


def _text(status: int, body: str) -> HttpResponse:
    return HttpResponse(body + "\n", status=status, content_type="text/plain; charset=utf-8")


async def follow(request: HttpRequest, xid: str, wid: str) -> HttpResponseBase:
    x, w = views._ids(xid, wid)
    try:
        async with events._checks_slot():
            stream, catch_up, who = await sync_to_async(_open)(request, x, w)
    except Unauthenticated as exc:
        return _text(401, str(exc))
    except (NotFound, PermissionDenied, Http404):
        return _text(404, "not found")
    except ResourceExhausted as exc:
        return _text(429, str(exc))
    except ServiceError as exc:
        return _text(503, str(exc))
    after = str(request.headers.get("Last-Event-ID") or request.GET.get("after") or "")[:40]
    timestamps = request.GET.get("ts") == "1"
    needle = request.GET.get("q", "")[:200]
    # The pump starts here, not in the generator: the slot it holds is given back even if the
    # response is never iterated (the client went away before the first byte).
    queue: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()
    threading.Thread(target=_pump, args=(stream.lines, asyncio.get_running_loop(), queue, stop, catch_up, who),
                     daemon=True, name="xmc-log-follow").start()
    frames = _frames(queue, stop, after, timestamps, needle, events._rechecker(request, x, []))
    response = StreamingHttpResponse(frames, content_type="text/event-stream")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"
    return response
