"""Cursors for the hot paths: server-side binding, prepared statements, and a cursor kept per connection.

Django's default psycopg cursor binds on the client: it quotes every
parameter into the SQL text, and Postgres parses and plans each statement
again. The hot writes (large JSON recordsets) and the hot reads (one
statement per API call) use `kept_cursor` instead: parameters travel
separately, and a statement run ``XMC_DB_PREPARE_THRESHOLD`` times on a
connection becomes a server-side prepared statement. It keeps Django's
query logging, execute wrappers and database-error translation.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import connection


def _raw_connection() -> Any:
    connection.ensure_connection()
    raw = connection.connection
    # Django opens connections with preparing off; only these cursors bind on
    # the server, so the threshold only ever applies to their statements.
    threshold = settings.XMC_DB_PREPARE_THRESHOLD or None
    if raw.prepare_threshold != threshold:
        raw.prepare_threshold = threshold
    return raw


def kept_cursor() -> Any:
    """A Django cursor with server-side binding, one psycopg cursor kept per connection and
    reused: do not close it, and fetch its rows before anything else runs a statement through it.

    A fresh psycopg cursor builds a loader for every column of every result
    (timestamps, JSON) again, which cost more than the rest of the cursor
    handling on the one-statement API reads. The cursor belongs to the
    calling thread's connection; a new one is made when that connection was
    replaced.
    """
    from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]

    raw = _raw_connection()
    kept = getattr(connection, "_xmc_kept_cursor", None)
    if kept is None or kept.connection is not raw or kept.closed:
        kept = ServerBindingCursor(raw)
        connection._xmc_kept_cursor = kept  # type: ignore[attr-defined]
    return connection._prepare_cursor(kept)  # type: ignore[attr-defined]


def int_array(values: Iterable[int]) -> str:
    """A Postgres array literal of ints (cast with ``::bigint[]`` in the SQL).

    psycopg's list dumper inspects every element in Python; for a batch's
    hundreds of ids the literal is several times cheaper.
    """
    return "{" + ",".join(str(int(v)) for v in values) + "}"
