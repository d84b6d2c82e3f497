"""A real ASGI server (uvicorn, the production entry ``xmc.asgi:application``) on the test database.

Run in a thread of the test process, so it sees the test database settings
and Redis; the tests using it need ``django_db(transaction=True)`` (the server's
connections must see committed rows).
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def asgi_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import uvicorn
    from django.db import connections

    from xmc import checks

    # The test settings run on the public development secret, which the servers' deploy
    # check refuses (rightly); the check itself is tested in tests/system/test_deploy_checks.py.
    monkeypatch.setattr(checks, "require_deploy_checks", lambda: None)
    from xmc.asgi import application

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    connections.close_all()
    # The server's worker threads (a2wsgi's pool, asgiref's thread for sync code) keep their
    # persistent connections (CONN_MAX_AGE) until they exit, which a daemon pool never does:
    # end those sessions, or the test database cannot be dropped.
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    connections.close_all()
