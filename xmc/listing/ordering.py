"""AIP-132 ``order_by`` parsed against a resource's orderable fields.

Called by :func:`xmc.listing.list_page`; the resulting :class:`OrderTerm` list
drives both the SQL ``ORDER BY`` and the keyset condition of
:mod:`xmc.listing.pagination`, which is why it always ends with a unique
tiebreaker (the primary key): without one, rows with equal sort keys could be
skipped or repeated across pages.

Syntax (AIP-132): a comma-separated list of field paths, each optionally
followed by ``asc`` or ``desc`` (any case); spaces around items are
insignificant. ``"create_time desc, name"``. A tiny strict parser is enough
here: each item must match one regular expression in full.

NULLs sort as the largest value (Postgres' default, spelled out explicitly in
:meth:`OrderTerm.expression`): last when ascending, first when descending.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured
from django.db.models import F
from django.db.models.expressions import OrderBy

from xmc.listing.errors import OrderByError

#: Longest accepted order_by, in characters.
MAX_ORDER_BY_LENGTH = 1024

#: A path segment after the first: a word that may hold ``/`` and ``-`` (a metric named ``train/loss``:
#: ``metrics.train/loss.last``), or any name in double quotes but a quote or comma
#: (``metrics."loss (val)".last``), as the filter syntax quotes one.
_SEGMENT = r'(?:[A-Za-z0-9_][A-Za-z0-9_/\-]*|"[^",\\]+")'
_ITEM = re.compile(rf"\s*(?P<field>[A-Za-z_][A-Za-z0-9_]*(?:\.{_SEGMENT})*)(?:\s+(?P<dir>\S+))?\s*")
_QUOTED = re.compile(r'"([^"]*)"')


@dataclass(frozen=True)
class OrderTerm:
    """One sort key: the API field name, its Django lookup and the direction."""

    field: str
    lookup: str
    descending: bool = False

    def expression(self) -> OrderBy:
        """The ORDER BY expression, with NULL placement explicit (NULL = largest)."""
        if self.descending:
            return F(self.lookup).desc(nulls_first=True)
        return F(self.lookup).asc(nulls_last=True)

    def spec(self) -> str:
        """A stable description (``lookup`` or ``-lookup``), used in page-token fingerprints."""
        return ("-" if self.descending else "") + self.lookup


def pk_term(descending: bool = False) -> OrderTerm:
    """The tiebreaker appended to every ordering that lacks a unique key.

    It takes the direction of the last term, so ``create_time desc`` becomes
    ``create_time desc, pk desc``: a plain btree index on ``(create_time, id)``
    then serves the whole ORDER BY and keyset condition (scanned backwards),
    since our NULL placement is Postgres' default too.
    """
    return OrderTerm("pk", "pk", descending)


def _parse_items(text: str, orderable: Mapping[str, str]) -> list[OrderTerm]:
    if len(text) > MAX_ORDER_BY_LENGTH:
        raise OrderByError(f"invalid order_by: {len(text)} characters long; at most {MAX_ORDER_BY_LENGTH} are allowed")
    terms: list[OrderTerm] = []
    seen: set[str] = set()
    offset = 0
    for item in text.split(","):
        m = _ITEM.fullmatch(item)
        if m is None:
            raise OrderByError(
                f"invalid order_by item {item.strip()!r} at position {offset + 1}; "
                "expected 'field', 'field asc' or 'field desc', separated by commas"
            )
        name, direction = _QUOTED.sub(r"\1", m.group("field")), m.group("dir")
        if name not in orderable:
            raise OrderByError(
                f"unknown field {name!r} in order_by; allowed: {', '.join(sorted(orderable)) or '(none)'}"
            )
        if direction is not None and direction.lower() not in ("asc", "desc"):
            raise OrderByError(f"invalid direction {direction!r} for {name!r} in order_by; use asc or desc")
        if name in seen:
            raise OrderByError(f"field {name!r} appears more than once in order_by")
        seen.add(name)
        terms.append(OrderTerm(name, orderable[name], direction is not None and direction.lower() == "desc"))
        offset += len(item) + 1
    return terms


def parse_order_by(
    text: str,
    orderable: Mapping[str, str],
    *,
    default: Sequence[str] = (),
    unique_lookups: Collection[str] = ("pk",),
) -> list[OrderTerm]:
    """Parse ``order_by`` over ``orderable`` (API field -> Django lookup).

    An empty ``text`` uses ``default`` (AIP-132 items over the same table,
    e.g. ``["create_time desc"]``). The result always ends with a unique key:
    :func:`pk_term` (in the last term's direction) is appended unless a term's lookup is in ``unique_lookups``.
    Raises OrderByError for the user's text, ImproperlyConfigured for a bad
    ``default`` (that is a programming error, not the caller's).
    """
    if text.strip():
        terms = _parse_items(text, orderable)
    elif default:
        try:
            terms = _parse_items(", ".join(default), orderable)
        except OrderByError as error:
            raise ImproperlyConfigured(f"bad default order {list(default)!r}: {error}") from None
    else:
        terms = []
    unique = {"pk", *unique_lookups}
    if not any(term.lookup in unique for term in terms):
        terms.append(pk_term(terms[-1].descending if terms else False))
    return terms


def order_expressions(terms: Sequence[OrderTerm]) -> list[OrderBy]:
    """The ``QuerySet.order_by`` arguments for ``terms``."""
    return [term.expression() for term in terms]
