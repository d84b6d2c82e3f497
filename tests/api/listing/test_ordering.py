"""AIP-132 order_by: parsing against the orderable table, and the order Postgres returns."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured

from tests.api.listing.conftest import FIELDS, ORDERABLE, users
from xmc.listing import OrderByError, OrderTerm, list_page, parse_order_by

PK = OrderTerm("pk", "pk")
PK_DESC = OrderTerm("pk", "pk", True)

# (order_by, default, expected terms)
VALID: list[tuple[str, list[str], list[OrderTerm]]] = [
    ("", [], [PK]),
    ("   ", [], [PK]),
    ("", ["create_time desc"], [OrderTerm("create_time", "date_joined", True), PK_DESC]),
    ("name", ["create_time desc"], [OrderTerm("name", "username"), PK]),
    (
        "create_time desc, name",
        [],
        [OrderTerm("create_time", "date_joined", True), OrderTerm("name", "username"), PK],
    ),
    (
        "  create_time   desc ,name asc ",
        [],
        [OrderTerm("create_time", "date_joined", True), OrderTerm("name", "username"), PK],
    ),
    ("name DESC", [], [OrderTerm("name", "username", True), PK_DESC]),
    ("status.last_login desc", [], [OrderTerm("status.last_login", "last_login", True), PK_DESC]),
    # the tiebreaker follows the last term's direction
    ("name desc, staff", [], [OrderTerm("name", "username", True), OrderTerm("staff", "is_staff"), PK]),
    # a unique key already present: no tiebreaker needed
    ("id desc", [], [OrderTerm("id", "id", True)]),
    ("staff, id", [], [OrderTerm("staff", "is_staff"), OrderTerm("id", "id")]),
]


@pytest.mark.parametrize(("text", "default", "expected"), VALID, ids=[f"{t!r}/{d}" for t, d, _ in VALID])
def test_it_parses_order_by_and_always_ends_with_a_unique_key(
    text: str, default: list[str], expected: list[OrderTerm]
) -> None:
    assert parse_order_by(text, ORDERABLE, default=default, unique_lookups=("pk", "id")) == expected


INVALID: list[tuple[str, str]] = [
    ("foo", "unknown field 'foo' in order_by; allowed: create_time, email, id, name, staff, state, status.last_login"),
    ("tags", "unknown field 'tags' in order_by"),
    ("name up", "invalid direction 'up' for 'name' in order_by; use asc or desc"),
    ("name desc extra", "invalid order_by item 'name desc extra' at position 1"),
    ("name,", "invalid order_by item '' at position 6"),
    (",name", "invalid order_by item '' at position 1"),
    ("name, ,id", "invalid order_by item '' at position 6"),
    ("name, name desc", "field 'name' appears more than once in order_by"),
    ("name;DROP TABLE auth_user", "invalid order_by item"),
    ("-name", "invalid order_by item '-name'"),
    ("name.", "invalid order_by item"),
    ("x" * 2000, "at most 1024 are allowed"),
]


@pytest.mark.parametrize(("text", "fragment"), INVALID, ids=[t[:30] for t, _ in INVALID])
def test_it_refuses_bad_order_by_naming_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(OrderByError) as caught:
        parse_order_by(text, ORDERABLE)
    assert fragment in str(caught.value)


def test_it_treats_a_bad_default_order_as_a_programming_error() -> None:
    with pytest.raises(ImproperlyConfigured, match="bad default order"):
        parse_order_by("", ORDERABLE, default=["nope desc"])


def _names(order_by: str) -> list[str]:
    page = list_page(
        users(),
        fields=FIELDS,
        orderable=ORDERABLE,
        filter="",
        order_by=order_by,
        page_size=0,
        page_token="",
        fingerprint="users",
    )
    return [u.username for u in page.items]


@pytest.mark.django_db
def test_it_orders_rows_as_asked_with_nulls_as_the_largest_value(cast: dict[str, User]) -> None:
    assert _names("create_time") == ["bob", "carol", "Edgar", "alice", "o'brien", "star*name", "zoë", "edge-runner"]
    assert _names("create_time desc") == [
        "edge-runner",
        "zoë",
        "star*name",
        "o'brien",
        "alice",
        "Edgar",
        "carol",
        "bob",
    ]
    # last_login: NULL (bob, edge-runner, o'brien, zoë) sorts last ascending, first descending;
    # the pk breaks ties in the same direction
    assert _names("status.last_login") == [
        "Edgar",
        "carol",
        "star*name",
        "alice",
        "bob",
        "edge-runner",
        "o'brien",
        "zoë",
    ]
    assert _names("status.last_login desc") == [
        "zoë",
        "o'brien",
        "edge-runner",
        "bob",
        "alice",
        "star*name",
        "carol",
        "Edgar",
    ]
    assert _names("staff desc, state, name desc") == [
        "star*name",
        "edge-runner",
        "alice",  # staff: FAILED, then RUNNING x2 (name desc)
        "Edgar",
        "bob",
        "o'brien",
        "carol",
        "zoë",  # not staff: '', FAILED, PENDING x2 (name desc), RUNNING
    ]
