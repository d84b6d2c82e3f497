"""The real web process, as deployed, on the test database: ``gunicorn xmc.asgi:application`` with the
web worker class (`scripts/run_all.py`, ``deploy/base/web.yaml``), one worker.

For attacks that must meet the real server (its worker class, its ASGI entry,
its sockets); tests using it need ``django_db(transaction=True)`` so the server
sees their rows.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
from django.conf import settings

from tests.childenv import child_database_url
from tests.ports import free_port


@contextmanager
def web_server(log: Path, **env: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """(its base URL, its process) while it runs; ``env``: settings of its own (``XMC_...``)."""
    port = free_port()
    full_env = {**os.environ, "DATABASE_URL": child_database_url(), "XMC_DEBUG": "true", "PYTHONUNBUFFERED": "1",
                "XMC_SECRET_KEY": settings.SECRET_KEY, **env}  # the tokens the test issues verify there
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "xmc.asgi:application", "--worker-class", "xmc.web_worker.UvicornWorker",
         "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        env=full_env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=10).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline and server.poll() is None, log.read_text()
            time.sleep(0.2)
        yield base, server
    finally:
        server.terminate()
        server.wait(timeout=30)
