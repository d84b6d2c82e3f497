"""A real ASGI server (uvicorn, the production entry ``xmc.asgi:application``) on the test database.

Run in a thread of the test process, so it sees the test database settings
and Redis; the tests using it need ``django_db(transaction=True)`` (the server's
connections must see committed rows).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from tests.ports import free_port


@pytest.fixture
def asgi_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import uvicorn
    from django.db import connections

    from xmc import checks

    # The test settings run on the public development secret, which the servers' deploy
    # check refuses (rightly); the check itself is tested in tests/system/test_deploy_checks.py.
    monkeypatch.setattr(checks, "require_deploy_checks", lambda: None)
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    from xmc.asgi import application as xmc_application

    # Static files from the apps' folders (collectstatic has not run for the tests).
    application = ASGIStaticFilesHandler(xmc_application)

    # The server's worker threads (xmc.wsgi_bridge's pool) would keep persistent connections
    # (CONN_MAX_AGE) for as long as they live, which holds the test database open:
    # every request closes its connection at its end instead.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    port = free_port()
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
