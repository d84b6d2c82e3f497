"""Make the database unreachable for this process (every thread's next connection) and bring it back.

``refused``: the host answers nothing on the port (connection refused, the
usual "Postgres is down"). ``stalled``: something accepts the TCP connection
and never answers (a network stall, a hung server): only the connect timeout
ends the attempt.
"""
from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections
from tests.ports import free_port


@contextmanager
def database_down(mode: str = "refused", *, close: Iterator[None] | None = None) -> Iterator[None]:
    listener: socket.socket | None = None
    if mode == "stalled":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # accepted by the kernel, never answered
        port = int(listener.getsockname()[1])
    else:
        port = free_port()
    settings = connections.settings["default"]
    saved = (settings["HOST"], settings["PORT"])
    connections.close_all()
    wrappers = [settings] + [c.settings_dict for c in connections.all(initialized_only=True)]
    for d in wrappers:
        d["HOST"], d["PORT"] = "127.0.0.1", port
    try:
        yield
    finally:
        for d in wrappers:
            d["HOST"], d["PORT"] = saved
        connections.close_all()
        if listener is not None:
            listener.close()
