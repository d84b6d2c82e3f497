"""Free TCP ports for the servers tests start: the one helper for every test and fixture."""
from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now, never the same twice in one test process.

    The kernel picks it (an ephemeral port, at random), so parallel workers and
    a second test run beside this one draw from the whole range; remembering
    what was handed out keeps two servers of one fixture from getting one port
    before either has bound it.
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
