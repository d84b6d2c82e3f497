"""Fixtures of the browser tests: ``site``, the production ASGI application served by uvicorn
(tests/ui/asgi_server.py) on the test database; Chromium is ``tests.fixtures.browsers``' ``browser``."""
from __future__ import annotations

import pytest

from tests.ui.asgi_server import asgi_server  # noqa: F401 - fixture


@pytest.fixture
def site(asgi_server: str) -> str:  # noqa: F811
    """The site's origin (``http://127.0.0.1:PORT``)."""
    return asgi_server
