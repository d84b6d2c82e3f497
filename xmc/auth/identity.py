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

The user lookup is cached per process for ``XMC_IDENTITY_CACHE_S`` seconds
(`xmc.auth.identity.IDENTITY_CACHE`, a thin layer around
`xmc.auth.identity.identity_for_email`): every RPC authenticates, and the
lookup was a third of a GetWorkUnit. A change to a user made in another
process (deactivation, staff rights, groups) takes effect within that window;
in this process it takes effect at once, because saving a user or group, or
changing a user's groups, empties the cache (`clear_identity_cache`).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from django.conf import settings
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


class IdentityCache:
    """``identity_for_email`` remembered per email for ``XMC_IDENTITY_CACHE_S`` seconds.

    Refusals (a deactivated account) are remembered too, so a refused
    caller does not cost a query per call either. ``XMC_IDENTITY_CACHE_S=0``
    turns caching off. Bounded: past ``max_entries`` emails it starts over.
    The clock is injectable for tests.
    """

    def __init__(self, load: Callable[[str], Identity], *, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self._max_entries = max_entries
        self.clock = clock
        self._entries: dict[str, tuple[float, Identity | Unauthenticated]] = {}
        self._lock = threading.Lock()

    def lookup(self, email: str) -> Identity:
        ttl_s: float = settings.XMC_IDENTITY_CACHE_S
        if ttl_s <= 0:
            return self._load(email)
        key = normalize_email(email)
        now = self.clock()
        entry = self._entries.get(key)
        if entry is None or entry[0] <= now:
            try:
                outcome: Identity | Unauthenticated = self._load(key)
            except Unauthenticated as exc:
                outcome = exc
            with self._lock:
                if len(self._entries) >= self._max_entries:
                    self._entries.clear()
                self._entries[key] = (now + ttl_s, outcome)
        else:
            outcome = entry[1]
        if isinstance(outcome, Unauthenticated):
            raise Unauthenticated(str(outcome))
        return outcome

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


#: The process-wide cache `authenticate_bearer` reads identities through.
IDENTITY_CACHE = IdentityCache(lambda email: identity_for_email(email))


def clear_identity_cache(*_args: object, **_kwargs: object) -> None:
    """Forget every cached identity (connected to user and group changes in `xmc.apps`)."""
    IDENTITY_CACHE.clear()


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
    trip, without a query. The lookup goes through `IDENTITY_CACHE`.
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
    return IDENTITY_CACHE.lookup(claims.email)


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
