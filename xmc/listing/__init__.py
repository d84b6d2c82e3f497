"""The list machinery behind every List*/Search* RPC and REST list view.

The API layer declares per resource which fields can be filtered
(:class:`FilterField`) and ordered (``{api_field: lookup}``), scopes a queryset
to what the caller may see, and calls :func:`list_page` with the request's
``filter``, ``order_by``, ``page_size`` and ``page_token``. Any
:class:`ListingError` it raises is the caller's fault: map it to
INVALID_ARGUMENT with ``str(error)`` as the message.

See docs/architecture/listing.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db.models import QuerySet

from xmc.listing.errors import FilterError, ListingError, OrderByError, PageSizeError, PageTokenError
from xmc.listing.filters import FilterField, compile_filter
from xmc.listing.ordering import OrderTerm, parse_order_by
from xmc.listing.pagination import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    fingerprint_of,
    paginate,
    resolve_page_size,
)

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "FilterError",
    "FilterField",
    "ListingError",
    "OrderByError",
    "OrderTerm",
    "Page",
    "PageSizeError",
    "PageTokenError",
    "compile_filter",
    "fingerprint_of",
    "list_page",
    "paginate",
    "parse_order_by",
    "resolve_page_size",
]

_Row = TypeVar("_Row")  # a model instance, or a dict for .values() querysets


@dataclass(frozen=True)
class Page(Generic[_Row]):
    """One page of results and the token for the next one ("" when this is the last page)."""

    items: list[_Row]
    next_page_token: str


def list_page(
    queryset: QuerySet[Any, _Row],
    *,
    fields: Mapping[str, FilterField],
    orderable: Mapping[str, str],
    filter: str,  # noqa: A002 - the AIP-160 request field is called filter
    order_by: str,
    page_size: int,
    page_token: str,
    fingerprint: str,
    default_order: Sequence[str] = (),
    max_age: int | None = None,
) -> Page[_Row]:
    """Filter, order and paginate ``queryset`` for one List/Search request.

    ``fingerprint`` names what is being listed and where, e.g.
    ``"workUnits|experiments/42"`` (add the caller's identity if the scoping
    depends on it). The filter and order_by are mixed in here, so a page token
    is only accepted back with the same resource, parent, filter and order_by.
    ``default_order`` (AIP-132 items over ``orderable``) applies when
    ``order_by`` is empty; the primary key always ends the ordering. One
    database query. Raises ListingError subclasses for invalid arguments.
    """
    size = resolve_page_size(page_size)
    condition = compile_filter(filter, fields)
    pk_name = queryset.model._meta.pk.name if queryset.model._meta.pk is not None else "pk"
    order: list[OrderTerm] = parse_order_by(order_by, orderable, default=default_order, unique_lookups=("pk", pk_name))
    items, next_token = paginate(
        queryset.filter(condition),
        order=order,
        page_size=size,
        page_token=page_token,
        fingerprint=fingerprint_of(fingerprint, filter, order_by),
        max_age=max_age,
    )
    return Page(items, next_token)
