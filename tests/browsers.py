"""The one way a test opens a real browser: Debian's Chromium through Playwright's sync API.

* ``CHROMIUM``: the executable, or None where the package is missing (``.ci/run``
  installs it); ``needs_chromium`` is the mark that skips a test then.
* :func:`chromium`: a launched browser for a ``with`` block, for tests that
  open it in the middle of a longer story.
* the ``browser`` fixture: the same for one whole test. When the test also has
  a ``site`` (a uvicorn of its own, ``tests/system/browser/``), the site is set
  up first so that Chromium closes first: its pages' open event streams would
  otherwise hold uvicorn's shutdown for 10 s after every test.

Playwright's sync API runs an event loop in the test's thread while the browser
is open, so Django would take the test's plain synchronous ORM calls for async
code: ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set for that time only, and restored
after. The loop also makes Django keep the test's database connection in a
context-local slot (asgiref's ``Local``), apart from the thread's own that
pytest-django closes: it is closed before the loop ends, or it would keep the
test database from being dropped.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="requires Debian's chromium package (.ci/run installs it)")

_ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed when the block ends."""
    from playwright.sync_api import sync_playwright

    previous = os.environ.get(_ASYNC_UNSAFE)
    os.environ[_ASYNC_UNSAFE] = "1"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                yield browser
            finally:
                connections.close_all()
                browser.close()
    finally:
        if previous is None:
            os.environ.pop(_ASYNC_UNSAFE, None)
        else:
            os.environ[_ASYNC_UNSAFE] = previous


@pytest.fixture
def browser(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Chromium for one test; closed before the test's own ``site`` stops (see the module's text)."""
    if "site" in request.fixturenames:
        request.getfixturevalue("site")
    with chromium() as opened:
        yield opened
