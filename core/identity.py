"""Who a caller is, as a value: `Identity` and the one spelling of an email.

Pure values and helpers, with no database and no token: the verifier that
builds an `Identity` from a bearer token is ``xmc.auth.identity``; the ACL
checks (``experiments.acl``) and the adapters only read it.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from core import limits


@dataclass(frozen=True)
class Identity:
    """A verified caller. ``email`` is normalized (`normalize_email`); staff and groups come from Django."""

    email: str
    is_staff: bool = False
    groups: frozenset[str] = frozenset()

    @property
    def domain(self) -> str:
        """The part of the email after the last ``@`` (``example.com``)."""
        return self.email.rpartition("@")[2]


def normalize_email(email: str) -> str:
    """The one spelling of an email we compare and store: stripped, NFKC-normalized, case-folded.

    NFKC folds compatibility look-alikes (full-width letters, ligatures) and
    ``casefold`` is Unicode's caseless matching (``ſ`` becomes ``s``), so two
    emails a human would read as one are one string here, and the database
    compares that string exactly (never with ``UPPER()``/``iexact``, whose
    folding differs from Python's).
    """
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", email.strip()).casefold())


def validated_email(email: str) -> str:
    """`normalize_email`, refusing anything that is not a valid address (ValueError)."""
    normalized = normalize_email(email)
    if len(normalized) > limits.EMAIL:
        raise ValueError(f"not an email address (longer than {limits.EMAIL} characters): {normalized[:64]!r}...")
    try:
        validate_email(normalized)
    except ValidationError:
        raise ValueError(f"not an email address: {normalized!r}") from None
    return normalized
