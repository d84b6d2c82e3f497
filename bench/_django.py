"""Shared set-up for benchmarks: Django on a throw-away test database."""
from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xmc.settings")
# The servers a benchmark starts refuse the public development secret
# (xmc.checks); a throw-away one per run, inherited by every child process.
os.environ.setdefault("XMC_SECRET_KEY", secrets.token_urlsafe(48))


@contextmanager
def bench_database() -> Iterator[None]:
    """Create a fresh ``test_<name>`` database with migrations; drop it afterwards."""
    import django

    django.setup()
    from django.db import connection

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        yield
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
