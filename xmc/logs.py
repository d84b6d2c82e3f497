"""Structured logs: one JSON object per line when ``XMC_LOG_FORMAT=json``, else plain text.

Every process configures logging from ``settings.LOGGING``; with the JSON
format each record becomes ``{"time", "level", "logger", "event", ...}`` plus
the record's ``extra`` fields (ids such as ``xid``, ``wid``, ``operation``,
``request_id``), so a log pipeline can filter by work unit or request without
parsing text. The plain format (:class:`PlainFormatter`) prints the same
extras after the event as ``key=value``. Log calls use dotted event names
(``reconciler.flush``) and pass values as ``extra``, never in the message.

Also here: :class:`RequestLogMiddleware` (one line per HTTP request, with a
request id taken from ``X-Request-ID`` or generated, echoed in the response)
and nothing for tasks: every task logs its own ``celery.task`` line through
its base class (``delivery.declare.Task``).
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse

#: Attributes every LogRecord has; anything else came in through ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call passed through ``extra``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class PlainFormatter(logging.Formatter):
    """``time level logger event key=value ...``: the extras follow the event, in the order given."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={_plain(v)}" for k, v in extras.items())
        return line


def _plain(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(text) if (not text or any(c.isspace() or c in "\"=" for c in text)) else text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


request_log = logging.getLogger("xmc.request")


class RequestLogMiddleware:
    """One ``http.request`` line per request: method, path, status, duration, identity."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request.headers.get("X-Request-ID", "")[:128] or uuid.uuid4().hex
        request.META["XMC_REQUEST_ID"] = request_id
        started = time.perf_counter()
        response = self.get_response(request)
        response["X-Request-ID"] = request_id
        if request.path not in ("/healthz", "/readyz", "/metrics"):
            request_log.info("http.request", extra={
                "request_id": request_id,
                "method": request.method,
                "path": request.path,
                "status": response.status_code,
                "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                "identity": _identity(request),
            })
        return response


def _identity(request: HttpRequest) -> str:
    """The signed-in user's email for the log line; "" when unknown or unreadable (database down)."""
    from django.db import DatabaseError

    try:
        return str(getattr(getattr(request, "user", None), "email", "") or "")
    except DatabaseError:
        return ""
