"""core.db: the hot paths' cursors bind on the server, prepare repeated statements, and one is kept per connection."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core import db

pytestmark = pytest.mark.django_db


def prepared() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%xmc-db-test%%'")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)  # outside a test transaction a closed connection is replaced
def test_it_reuses_the_kept_cursor_until_its_connection_is_replaced() -> None:
    first = db.kept_cursor().cursor
    assert db.kept_cursor().cursor is first
    connection.close()
    assert db.kept_cursor().cursor is not first


def test_it_logs_the_statements_through_it_and_prepares_them_after_the_threshold(settings: Any) -> None:
    settings.XMC_DB_PREPARE_THRESHOLD = 2
    with CaptureQueriesContext(connection) as queries:
        for _ in range(4):
            cursor = db.kept_cursor()
            cursor.execute("SELECT %s::int /* xmc-db-test */", [1])
            assert cursor.fetchone() == (1,)
    assert len(queries.captured_queries) == 4
    assert prepared() == 1


def test_it_prepares_nothing_with_a_threshold_of_zero(settings: Any) -> None:
    settings.XMC_DB_PREPARE_THRESHOLD = 0
    for _ in range(4):
        db.kept_cursor().execute("SELECT %s::int /* xmc-db-test */", [2])
    assert prepared() == 0


def test_it_makes_int_array_a_postgres_array_literal() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::bigint[]", [db.int_array([3, 1, 2])])
        assert cursor.fetchone()[0] == [3, 1, 2]
        cursor.execute("SELECT %s::bigint[]", [db.int_array([])])
        assert cursor.fetchone()[0] == []
