"""What a child process the tests start needs to reach the suite's own services.

The test database pytest-django made lives on the suite's server, which is a
Unix socket directory under ``./dev test``'s embedded Postgres (``.run/test/pg``)
and a TCP host in CI setups that set ``DATABASE_URL``. A URL's host cannot hold
the directory's slashes, so it is percent-encoded, as ``xmc.settings`` (django-
environ) reads it back.
"""
from __future__ import annotations

from urllib.parse import quote

from django.db import connection


def child_database_url() -> str:
    """``DATABASE_URL`` of the test database, for a worker, reconciler or server the test starts."""
    db = connection.settings_dict
    host = quote(db["HOST"] or "127.0.0.1", safe="")
    return f"postgres://{db['USER']}@{host}:{db['PORT'] or 5432}/{db['NAME']}"
