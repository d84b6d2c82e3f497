"""Who is calling: the verified `Identity` and the one bearer verifier.

Every entry point that serves the API authenticates the same way: it hands the
raw ``Authorization`` value to `xmc.auth.identity.authenticate_bearer`, which
verifies the server-signed JWT (`xmc.auth.tokens`) and resolves staff rights and
groups from the Django user with the same email. The gRPC interceptor
(`xmc.auth.grpc.AuthInterceptor`) and the DRF authentication class
(`xmc.auth.drf.BearerAuthentication`) are thin adapters over it.

gRPC handlers read the caller with `xmc.auth.identity.current_identity`; the
interceptor binds it in a context variable for exactly the duration of one RPC.
The email the client *asserts* in ``x-goog-user-email`` is kept beside it for
audit only (`xmc.auth.identity.current_asserted_email`) and is never used to
decide anything.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from django.contrib.auth import get_user_model

# The one UNAUTHENTICATED error of the project; re-exported for the adapters.
from xmc.errors import Unauthenticated as Unauthenticated

BEARER_SCHEME = "bearer"


@dataclass(frozen=True)
class Identity:
    """A verified caller. ``email`` is lower-cased; staff and groups come from Django."""

    email: str
    is_staff: bool = False
    groups: frozenset[str] = frozenset()

    @property
    def domain(self) -> str:
        """The part of the email after the last ``@`` (``example.com``)."""
        return self.email.rpartition("@")[2]


def normalize_email(email: str) -> str:
    """The one spelling of an email we compare and store: stripped, lower-cased."""
    return email.strip().lower()


def identity_for_email(email: str) -> Identity:
    """Build the `Identity` for a verified email, with one database query.

    The Django user is matched case-insensitively. Several users may share an
    email (Django does not enforce uniqueness); the active one with the lowest
    primary key wins, deterministically. No active user means "not staff, no
    groups" -- a token for a service account needs no Django user -- but if the
    only matching users are deactivated the caller is refused: deactivating a
    user is how an operator revokes their tokens.
    """
    email = normalize_email(email)
    user_model = get_user_model()
    # One LEFT OUTER JOIN over users and their group names instead of a user
    # query plus a groups query: this runs on every RPC.
    rows = list(
        user_model.objects.filter(email__iexact=email)
        .order_by("-is_active", "pk")
        .values_list("pk", "is_active", "is_staff", "groups__name")
    )
    if not rows:
        return Identity(email=email)
    first_pk, is_active, is_staff, _ = rows[0]
    if not is_active:
        raise Unauthenticated(f"the account {email} is deactivated")
    groups = frozenset(name for pk, _, _, name in rows if pk == first_pk and name)
    return Identity(email=email, is_staff=bool(is_staff), groups=groups)


def bearer_token_from_header(authorization_header_value: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` value, or `Unauthenticated`."""
    if authorization_header_value is None or not authorization_header_value.strip():
        raise Unauthenticated(
            "missing bearer token: send 'authorization: Bearer <token>' "
            "(get one with `xmanager login` or `manage.py issue_token`)"
        )
    scheme, _, token = authorization_header_value.strip().partition(" ")
    if scheme.lower() != BEARER_SCHEME:
        raise Unauthenticated(f"unsupported authorization scheme {scheme!r}: expected 'Bearer <token>'")
    token = token.strip()
    if not token:
        raise Unauthenticated("empty bearer token")
    return token


def authenticate_bearer(
    authorization_header_value: str | None, *, admit: Callable[[str], None] | None = None
) -> Identity:
    """The single verifier: ``Authorization`` header value -> `Identity`.

    Raises `Unauthenticated` with a message fit for the caller when the header
    is missing, has another scheme, or carries a token that does not verify
    (malformed, bad signature, expired, wrong issuer, no email) or belongs to a
    deactivated user. Database errors propagate unchanged (they are not the
    caller's fault and must not read as UNAUTHENTICATED).

    ``admit``, if given, is called with the verified email after the token
    checks and *before* the database lookup, and may raise to refuse the call:
    the gRPC interceptor meters the rate limit there, so a client hammering the
    API is turned away for the price of a signature check and one Redis round
    trip, without a query.
    """
    # Imported here, not at the top: `xmc.auth.tokens` builds `Identity`
    # objects from this module, so a top-level import would be circular.
    from xmc.auth.tokens import InvalidToken, decode_token

    token = bearer_token_from_header(authorization_header_value)
    try:
        claims = decode_token(token)
    except InvalidToken as exc:
        raise Unauthenticated(f"invalid bearer token: {exc}") from exc
    if admit is not None:
        admit(claims.email)
    return identity_for_email(claims.email)


# --- The caller of the current gRPC handler ---------------------------------

_current_identity: ContextVar[Identity | None] = ContextVar("xmc_current_identity", default=None)
_current_asserted_email: ContextVar[str | None] = ContextVar("xmc_current_asserted_email", default=None)


def current_identity() -> Identity:
    """The verified caller of the RPC being handled; `Unauthenticated` outside one."""
    identity = _current_identity.get()
    if identity is None:
        raise Unauthenticated("no authenticated identity is bound to this call")
    return identity


def current_identity_or_none() -> Identity | None:
    """Like `current_identity` but `None` outside an authenticated call."""
    return _current_identity.get()


def current_asserted_email() -> str | None:
    """The ``x-goog-user-email`` the client sent, for audit records only. Never authorize with it."""
    return _current_asserted_email.get()


@contextlib.contextmanager
def bound_identity(identity: Identity, asserted_email: str | None = None) -> Iterator[Identity]:
    """Bind ``identity`` (and the audit-only asserted email) for the enclosed block.

    Used by the gRPC interceptor around each handler; tests and internal
    callers may use it to run handler code as somebody.
    """
    identity_token = _current_identity.set(identity)
    email_token = _current_asserted_email.set(asserted_email)
    try:
        yield identity
    finally:
        _current_asserted_email.reset(email_token)
        _current_identity.reset(identity_token)
