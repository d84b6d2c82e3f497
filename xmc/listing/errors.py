"""Errors raised by the list machinery (filters, order_by, page tokens, page sizes).

Every one of them is the caller's fault, so the API layer (gRPC servicer and
REST views) maps :class:`ListingError` and all its subclasses to
INVALID_ARGUMENT and returns ``str(error)`` as the message. Messages name the
offending field, value or position so a user can fix the request.
"""

from __future__ import annotations


class ListingError(ValueError):
    """Base class: a List/Search request argument is invalid (INVALID_ARGUMENT)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class FilterError(ListingError):
    """The ``filter`` is not valid AIP-160 or does not fit the resource's fields."""


class OrderByError(ListingError):
    """The ``order_by`` is not valid AIP-132 or names a field that cannot be ordered."""


class PageTokenError(ListingError):
    """The ``page_token`` was tampered with, is malformed, or belongs to another request."""


class PageSizeError(ListingError):
    """The ``page_size`` is negative."""
