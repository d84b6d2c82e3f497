"""Keyset pagination with opaque, signed page tokens (AIP-158).

Called by :func:`xmc.listing.list_page`. A page is one query: the filtered
queryset, ordered by the request's :class:`xmc.listing.ordering.OrderTerm`
list (which ends with the primary key), restricted to rows strictly after the
previous page's last row, limited to ``page_size + 1`` rows (the extra row
only tells us whether another page exists).

The page token carries the last row's sort-key values and a hash of the
request's fingerprint (resource, parent, filter, order_by and the resolved
ordering). It is signed with ``django.core.signing`` (HMAC over
``SECRET_KEY`` with a dedicated salt), so a modified token is rejected, and a
token presented with a different filter or order is rejected too. Tokens are
signed, not encrypted: they reveal the sort keys of a row the caller has
already received.

Offsets are never used, so rows inserted or deleted between pages do not
shift later pages: each row is returned at most once, in order.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

from django.core import signing
from django.core.exceptions import FieldDoesNotExist
from django.db.models import F, Model, Q, QuerySet
from django.db.models.constants import LOOKUP_SEP

from xmc.listing.errors import PageSizeError, PageTokenError
from xmc.listing.ordering import OrderTerm

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
#: Longest page token accepted; ours are far shorter (a few hundred characters).
MAX_PAGE_TOKEN_LENGTH = 4096
TOKEN_SALT = "xmc.listing.page_token.v1"
_TOKEN_VERSION = 1
_KEY_PREFIX = "_xmc_page_key_"

_Row = TypeVar("_Row")  # a model instance, or a dict for .values() querysets


def resolve_page_size(page_size: int) -> int:
    """AIP-158 page size: 0 means the default (100), above 1000 is clamped, negative is an error."""
    if page_size < 0:
        raise PageSizeError(f"page_size must not be negative (got {page_size})")
    if page_size == 0:
        return DEFAULT_PAGE_SIZE
    return min(page_size, MAX_PAGE_SIZE)


def fingerprint_of(*parts: str) -> str:
    """A collision-safe digest of request parts (each part is length-prefixed)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def _token_fingerprint(fingerprint: str, order: Sequence[OrderTerm]) -> str:
    # 128 bits is plenty against accidental reuse; forgery is stopped by the signature.
    return fingerprint_of(fingerprint, ",".join(term.spec() for term in order))[:32]


# --- Sort-key values in tokens ------------------------------------------------------------


def _encode_value(value: object) -> list[Any]:
    if value is None:
        return ["n", None]
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", value]
    if isinstance(value, float):
        return ["f", value]
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, dt.datetime):
        return ["dt", value.isoformat()]
    if isinstance(value, dt.date):
        return ["d", value.isoformat()]
    if isinstance(value, decimal.Decimal):
        return ["dec", str(value)]
    if isinstance(value, uuid.UUID):
        return ["u", str(value)]
    if isinstance(value, bytes):
        return ["by", base64.b64encode(value).decode("ascii")]
    raise TypeError(f"cannot put a {type(value).__name__} sort key into a page token")


def _decode_value(item: object) -> object:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
        raise ValueError(item)
    tag, raw = item
    if tag == "n" and raw is None:
        return None
    if tag == "b" and isinstance(raw, bool):
        return raw
    if tag == "i" and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if tag == "f" and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if tag == "s" and isinstance(raw, str):
        return raw
    if isinstance(raw, str):
        if tag == "dt":
            return dt.datetime.fromisoformat(raw)
        if tag == "d":
            return dt.date.fromisoformat(raw)
        if tag == "dec":
            return decimal.Decimal(raw)
        if tag == "u":
            return uuid.UUID(raw)
        if tag == "by":
            return base64.b64decode(raw, validate=True)
    raise ValueError(item)


def encode_page_token(values: Sequence[object], *, fingerprint: str, order: Sequence[OrderTerm]) -> str:
    """Sign the last row's sort-key ``values`` for the request ``fingerprint``."""
    payload = {
        "v": _TOKEN_VERSION,
        "fp": _token_fingerprint(fingerprint, order),
        "k": [_encode_value(v) for v in values],
    }
    return signing.dumps(payload, salt=TOKEN_SALT, compress=True)


def decode_page_token(
    token: str, *, fingerprint: str, order: Sequence[OrderTerm], max_age: int | None = None
) -> list[object]:
    """The sort-key values in ``token``; PageTokenError if forged, expired or for another request."""
    if len(token) > MAX_PAGE_TOKEN_LENGTH:
        raise PageTokenError("page_token is invalid: too long")
    try:
        payload = signing.loads(token, salt=TOKEN_SALT, max_age=max_age)
    except signing.SignatureExpired:
        raise PageTokenError("page_token has expired; start again with an empty page_token") from None
    except (signing.BadSignature, ValueError, UnicodeError):
        # BadSignature covers any modification; ValueError/UnicodeError cover
        # garbage that never was one of our tokens.
        raise PageTokenError("page_token is invalid or has been tampered with") from None
    if not isinstance(payload, dict) or payload.get("v") != _TOKEN_VERSION:
        raise PageTokenError("page_token is invalid or was issued by an incompatible server version")
    keys = payload.get("k")
    if (
        payload.get("fp") != _token_fingerprint(fingerprint, order)
        or not isinstance(keys, list)
        or len(keys) != len(order)
    ):
        raise PageTokenError(
            "page_token does not match the request (resource, parent, filter or order_by changed); "
            "start again with an empty page_token"
        )
    try:
        return [_decode_value(item) for item in keys]
    except (ValueError, TypeError):
        raise PageTokenError("page_token is invalid or has been tampered with") from None


# --- Keyset condition ----------------------------------------------------------------------


def _equal(term: OrderTerm, value: object) -> Q:
    if value is None:
        return Q(**{f"{term.lookup}__isnull": True})
    return Q(**{term.lookup: value})


def _strictly_after(term: OrderTerm, value: object, nullable: bool) -> Q | None:
    """Rows that sort after ``value`` on this key alone (None: no row can).

    NULL is the largest value: last when ascending, first when descending
    (matching OrderTerm.expression()). ``nullable=False`` drops the IS NULL
    branch for columns that cannot hold NULL.
    """
    if term.descending:
        if value is None:
            return Q(**{f"{term.lookup}__isnull": False})
        return Q(**{f"{term.lookup}__lt": value})
    if value is None:
        return None
    after = Q(**{f"{term.lookup}__gt": value})
    return after | Q(**{f"{term.lookup}__isnull": True}) if nullable else after


def _leading_bound(term: OrderTerm, value: object, nullable: bool) -> Q | None:
    """A redundant range on the first key that Postgres can use as an index condition.

    The OR-expanded keyset condition alone only filters an index scan that
    starts at the beginning, so page N would read N pages of rows; with this
    bound the scan starts at the cursor.
    """
    if value is None:
        return Q(**{f"{term.lookup}__isnull": True}) if not term.descending else None
    if term.descending:
        return Q(**{f"{term.lookup}__lte": value})  # NULLs sort first, so are before the cursor
    return None if nullable else Q(**{f"{term.lookup}__gte": value})


def keyset_after(
    order: Sequence[OrderTerm], values: Sequence[object], nullable: Sequence[bool] | None = None
) -> Q | None:
    """Rows strictly after ``values`` in ``order``, as a Q (None when no row can be).

    The usual expansion of ``(a, b, pk) > (x, y, z)`` for mixed directions:
    ``a after x OR (a = x AND b after y) OR (a = x AND b = y AND pk after z)``,
    ANDed with an index-friendly bound on ``a``. ``nullable`` says which keys
    may be NULL (all of them when not given).
    """
    flags = list(nullable) if nullable is not None else [True] * len(order)
    disjuncts: list[Q] = []
    prefix = Q()
    for term, value, may_be_null in zip(order, values, flags, strict=True):
        step = _strictly_after(term, value, may_be_null)
        if step is not None:
            disjuncts.append(prefix & step)
        prefix &= _equal(term, value)
    if not disjuncts:
        return None
    result = disjuncts[0]
    for disjunct in disjuncts[1:]:
        result |= disjunct
    bound = _leading_bound(order[0], values[0], flags[0])
    return bound & result if bound is not None else result


def lookup_is_nullable(model: type[Model], lookup: str) -> bool:
    """Whether ``lookup`` on ``model`` may be NULL; True when unsure (annotations, transforms, reverse relations)."""
    opts = model._meta
    parts = lookup.split(LOOKUP_SEP)
    for i, part in enumerate(parts):
        try:
            field = opts.pk if part == "pk" else opts.get_field(part)
        except FieldDoesNotExist:
            return True
        if field is None or getattr(field, "null", True):
            return True
        if field.is_relation:
            if not (field.many_to_one or (field.one_to_one and field.concrete)) or field.related_model is None:
                return True
            if isinstance(field.related_model, str):
                return True
            opts = field.related_model._meta
        elif i != len(parts) - 1:
            return True
    return False


def paginate(
    queryset: QuerySet[Any, _Row],
    *,
    order: Sequence[OrderTerm],
    page_size: int,
    page_token: str,
    fingerprint: str,
    max_age: int | None = None,
) -> tuple[list[_Row], str]:
    """One page of ``queryset`` in ``order`` and the token for the next page ("" on the last page).

    ``order`` must end with a unique key (parse_order_by guarantees it).
    ``fingerprint`` identifies the request (see fingerprint_of); a token is only
    accepted back with the same fingerprint and order. One query per call.
    """
    size = resolve_page_size(page_size)
    if not order:
        raise ValueError("paginate() needs a non-empty order ending with a unique key")
    aliases = [f"{_KEY_PREFIX}{i}" for i in range(len(order))]
    qs = queryset.annotate(**{alias: F(term.lookup) for alias, term in zip(aliases, order, strict=True)})
    qs = qs.order_by(*(term.expression() for term in order))
    if page_token:
        values = decode_page_token(page_token, fingerprint=fingerprint, order=order, max_age=max_age)
        nullable = [lookup_is_nullable(queryset.model, term.lookup) for term in order]
        after = keyset_after(order, values, nullable)
        if after is None:
            return [], ""
        qs = qs.filter(after)
    rows = list(qs[: size + 1])
    if len(rows) <= size:
        return rows, ""
    rows = rows[:size]
    last = rows[-1]
    if isinstance(last, dict):  # a .values() queryset
        key_values = [last[alias] for alias in aliases]
    else:
        key_values = [getattr(last, alias) for alias in aliases]
    return rows, encode_page_token(key_values, fingerprint=fingerprint, order=order)
