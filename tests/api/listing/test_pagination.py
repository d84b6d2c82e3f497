"""Keyset pagination and page tokens: complete, ordered walks; tokens that
cannot be forged or reused for another request; AIP-158 page sizes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core import signing
from django.db.models import Q

from tests.api.listing.conftest import FIELDS, ORDERABLE, UTC, users
from xmc.listing import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    Page,
    PageSizeError,
    PageTokenError,
    list_page,
    parse_order_by,
    resolve_page_size,
)
from xmc.listing.pagination import TOKEN_SALT, keyset_after, lookup_is_nullable

BASE = dt.datetime(2026, 1, 1, tzinfo=UTC)
STATES = ("RUNNING", "PENDING", "FAILED", "")


def make_crowd(n: int) -> list[User]:
    """n users with many ties and NULLs in every sort key."""
    return User.objects.bulk_create(
        User(
            username=f"user{i:05d}",
            # Emails are unique when set (xmc migration 0003); ties come from the blank ones.
            email="" if i % 3 else f"u{i}@example.com",
            first_name=STATES[i % 4],
            is_staff=i % 2 == 0,
            date_joined=BASE + dt.timedelta(minutes=i % 37),
            last_login=None if i % 5 == 0 else BASE + dt.timedelta(hours=i % 11),
        )
        for i in range(n)
    )


def page(**overrides: Any) -> Page[User]:
    args: dict[str, Any] = dict(
        fields=FIELDS,
        orderable=ORDERABLE,
        filter="",
        order_by="",
        page_size=0,
        page_token="",
        fingerprint="users",
        default_order=["create_time desc"],
    )
    args.update(overrides)
    return list_page(users(), **args)


def walk(page_size: int, **overrides: Any) -> tuple[list[int], list[int]]:
    """All pages from an empty token to the end: (ids in order, page lengths)."""
    ids: list[int] = []
    sizes: list[int] = []
    token = ""
    while True:
        result = page(page_size=page_size, page_token=token, **overrides)
        ids.extend(u.pk for u in result.items)
        sizes.append(len(result.items))
        token = result.next_page_token
        if not token:
            return ids, sizes
        assert len(sizes) < 10_000, "pagination does not terminate"


def python_order(order_by: str, rows: list[dict[str, Any]]) -> list[int]:
    """The documented order computed in Python: NULL is the largest value, pk breaks ties."""
    terms = parse_order_by(order_by, ORDERABLE, default=["create_time desc"], unique_lookups=("pk", "id"))
    ordered = list(rows)
    for term in reversed(terms):  # stable sorts, last key first
        key = "id" if term.lookup == "pk" else term.lookup
        ordered.sort(key=lambda r: (r[key] is None, r[key] if r[key] is not None else 0), reverse=term.descending)
    return [r["id"] for r in ordered]


ORDERS = [
    "",
    "create_time desc, name",
    "staff, status.last_login desc",
    "status.last_login, staff desc, create_time",
    "state desc, id desc",
]


@pytest.mark.django_db
@pytest.mark.parametrize("page_size", [1000, 7])
@pytest.mark.parametrize("order_by", ORDERS)
def test_it_walks_every_row_exactly_once_in_order(order_by: str, page_size: int) -> None:
    make_crowd(2500)
    rows: list[dict[str, Any]] = [
        dict(r) for r in User.objects.values("id", "username", "first_name", "is_staff", "date_joined", "last_login")
    ]
    ids, sizes = walk(page_size, order_by=order_by)
    assert len(ids) == len(set(ids)) == 2500
    assert ids == python_order(order_by, rows)
    assert all(s == page_size for s in sizes[:-1]) and 1 <= sizes[-1] <= page_size


@pytest.mark.django_db
def test_it_walks_a_filtered_listing_in_order() -> None:
    make_crowd(500)
    wanted = "staff=true OR state=RUNNING"
    everything, _ = walk(1000, filter=wanted, order_by="status.last_login desc")
    paged, sizes = walk(9, filter=wanted, order_by="status.last_login desc")
    assert paged == everything
    assert len(paged) == 250  # even i; i % 4 == 0 (RUNNING) is already even
    assert max(sizes) == 9


@pytest.mark.django_db
def test_it_fetches_each_page_with_one_query(django_assert_num_queries: Callable[..., Any]) -> None:
    make_crowd(30)
    first = page(page_size=10, order_by="state, status.last_login")
    with django_assert_num_queries(1):
        second = page(page_size=10, order_by="state, status.last_login", page_token=first.next_page_token)
    assert len(second.items) == 10


@pytest.mark.django_db
def test_it_neither_repeats_nor_skips_rows_when_others_are_added_or_removed_between_pages() -> None:
    crowd = make_crowd(40)
    first = page(page_size=10, order_by="name")
    assert [u.username for u in first.items] == [f"user{i:05d}" for i in range(10)]
    User.objects.create(username="user00000a")  # sorts inside the first page: not seen later
    User.objects.filter(pk=crowd[15].pk).delete()  # removed ahead of the cursor
    User.objects.filter(pk=crowd[3].pk).delete()  # removed behind the cursor
    seen = [u.username for u in first.items]
    token = first.next_page_token
    while token:
        result = page(page_size=10, order_by="name", page_token=token)
        seen += [u.username for u in result.items]
        token = result.next_page_token
    assert seen == [f"user{i:05d}" for i in range(40) if i != 15]


@pytest.mark.django_db
def test_it_ends_with_an_empty_token_on_the_last_page() -> None:
    make_crowd(20)
    assert page(page_size=20).next_page_token == ""
    first = page(page_size=19)
    last = page(page_size=19, page_token=first.next_page_token)
    assert len(last.items) == 1 and last.next_page_token == ""
    empty = page(filter="name=nobody")
    assert empty.items == [] and empty.next_page_token == ""


@pytest.mark.django_db
def test_it_serves_values_querysets_too() -> None:
    make_crowd(5)
    first = list_page(
        User.objects.values("username"),
        fields=FIELDS,
        orderable=ORDERABLE,
        filter="",
        order_by="name desc",
        page_size=3,
        page_token="",
        fingerprint="users",
    )
    rest = list_page(
        User.objects.values("username"),
        fields=FIELDS,
        orderable=ORDERABLE,
        filter="",
        order_by="name desc",
        page_size=3,
        page_token=first.next_page_token,
        fingerprint="users",
    )
    assert [r["username"] for r in first.items + rest.items] == [f"user{i:05d}" for i in (4, 3, 2, 1, 0)]


# --- page sizes -------------------------------------------------------------------------------------


def test_it_applies_aip158_page_size_rules() -> None:
    assert resolve_page_size(0) == DEFAULT_PAGE_SIZE == 100
    assert resolve_page_size(1) == 1
    assert resolve_page_size(1000) == MAX_PAGE_SIZE == 1000
    assert resolve_page_size(1001) == 1000
    assert resolve_page_size(2**31 - 1) == 1000
    with pytest.raises(PageSizeError, match="page_size must not be negative"):
        resolve_page_size(-1)


@pytest.mark.django_db
def test_it_defaults_to_100_rows_and_clamps_to_1000() -> None:
    make_crowd(1100)
    assert len(page(page_size=0).items) == 100
    assert len(page(page_size=5000).items) == 1000
    with pytest.raises(PageSizeError, match="page_size"):
        page(page_size=-5)


@pytest.mark.django_db
def test_it_lets_the_page_size_change_between_pages() -> None:
    make_crowd(30)
    first = page(page_size=10)
    second = page(page_size=15, page_token=first.next_page_token)
    assert len(second.items) == 15
    assert {u.pk for u in first.items}.isdisjoint(u.pk for u in second.items)


# --- tokens ------------------------------------------------------------------------------------------


@pytest.fixture
def token(db: None) -> str:
    make_crowd(30)
    result = page(page_size=10, filter="staff=true", order_by="create_time desc")
    assert result.next_page_token
    return result.next_page_token


def test_it_accepts_its_own_token_for_the_same_request(token: str) -> None:
    result = page(page_size=10, filter="staff=true", order_by="create_time desc", page_token=token)
    assert len(result.items) == 5


@pytest.mark.parametrize(
    "changes",
    [
        {"filter": "staff=false"},
        {"filter": "staff=true "},
        {"order_by": "create_time"},
        {"order_by": "name"},
        {"fingerprint": "users|someone-else"},
        {"default_order": ["name"], "order_by": ""},
    ],
    ids=["other filter", "reformatted filter", "other direction", "other field", "other parent", "other order"],
)
def test_it_refuses_a_token_reused_with_another_request(token: str, changes: dict[str, Any]) -> None:
    request: dict[str, Any] = {"filter": "staff=true", "order_by": "create_time desc", **changes}
    with pytest.raises(PageTokenError, match="page_token does not match the request"):
        page(page_size=10, page_token=token, **request)


def _tampered(token: str) -> list[str]:
    flipped = []
    for i in (0, len(token) // 2, len(token) - 1):
        c = token[i]
        flipped.append(token[:i] + ("A" if c != "A" else "B") + token[i + 1 :])
    payload = signing.loads(token, salt=TOKEN_SALT)
    payload["k"][0] = ["s", "zzz"]
    forged_other_salt = signing.dumps(payload, salt="some.other.salt", compress=True)
    forged_other_key = signing.dumps(payload, salt=TOKEN_SALT, key="not-our-secret", compress=True)
    body, _, _ = token.rpartition(":")
    return [
        *flipped,
        forged_other_salt,
        forged_other_key,
        body + ":" + "x" * 27,
        token + "x",
        token[:-1],
        "garbage",
        "::::",
        "ünïcode:token",
        "a" * 5000,
    ]


def test_it_refuses_tampered_or_forged_tokens(token: str) -> None:
    for bad in _tampered(token):
        with pytest.raises(PageTokenError, match="page_token is invalid"):
            page(page_size=10, filter="staff=true", order_by="create_time desc", page_token=bad)


def test_it_keeps_tokens_opaque_but_not_secret(token: str) -> None:
    # Signed, not encrypted: the last row's sort keys are inside, and nothing else.
    payload = signing.loads(token, salt=TOKEN_SALT)
    assert set(payload) == {"v", "fp", "k"}
    assert "staff=true" not in token


def test_it_can_expire_tokens(token: str) -> None:
    kwargs: dict[str, Any] = {"page_size": 10, "filter": "staff=true", "order_by": "create_time desc", "max_age": 3600}
    page(page_token=token, **kwargs)
    later = dt.datetime.now(tz=UTC) + dt.timedelta(hours=2)
    with time_machine.travel(later, tick=False), pytest.raises(PageTokenError, match="page_token has expired"):
        page(page_token=token, **kwargs)


# --- the keyset condition ----------------------------------------------------------------------------


def test_it_knows_which_sort_keys_can_be_null() -> None:
    assert not lookup_is_nullable(User, "pk")
    assert not lookup_is_nullable(User, "id")
    assert not lookup_is_nullable(User, "username")
    assert not lookup_is_nullable(User, "date_joined")
    assert lookup_is_nullable(User, "last_login")
    assert lookup_is_nullable(User, "tags")  # an annotation: unknown, so assume NULLs
    assert lookup_is_nullable(User, "groups__name")  # a many-to-many may be missing
    assert lookup_is_nullable(User, "username__lower")  # a transform: unknown


def test_it_bounds_the_first_key_so_postgres_can_start_the_index_scan_at_the_cursor() -> None:
    by_name = parse_order_by("name", ORDERABLE)
    assert keyset_after(by_name, ["bob", 7], [False, False]) == Q(username__gte="bob") & (
        Q(username__gt="bob") | (Q(username="bob") & Q(pk__gt=7))
    )
    newest = parse_order_by("create_time desc", ORDERABLE)
    assert keyset_after(newest, [BASE, 7], [False, False]) == Q(date_joined__lte=BASE) & (
        Q(date_joined__lt=BASE) | (Q(date_joined=BASE) & Q(pk__lt=7))
    )
    # A nullable ascending key has NULLs after every value: no bound, and NULL rows stay in.
    by_login = parse_order_by("status.last_login", ORDERABLE)
    assert keyset_after(by_login, [BASE, 7], [True, False]) == (Q(last_login__gt=BASE) | Q(last_login__isnull=True)) | (
        Q(last_login=BASE) & Q(pk__gt=7)
    )
    # Past the last non-null value only NULLs remain.
    assert keyset_after(by_login, [None, 7], [True, False]) == Q(last_login__isnull=True) & (
        Q(last_login__isnull=True) & Q(pk__gt=7)
    )
