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

The lookup is cached per process for ``XMC_IDENTITY_CACHE_S`` seconds
(`xmc.auth.identity.IDENTITY_CACHE`, a thin layer around the one query of
`xmc.auth.identity.identity_for_email`): every RPC authenticates, and the
lookup was a third of a GetWorkUnit. A change made in another process
(deactivation, staff rights, groups, a token revocation) takes effect within
that window; in this process it takes effect at once, because saving a user or
group, changing a user's groups, or revoking tokens empties the cache
(`clear_identity_cache`).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from django.conf import settings
from django.db import connection

from core.identity import Identity as Identity
from core.identity import normalize_email as normalize_email
from core.identity import validated_email as validated_email
from xmc.auth.tokens import InvalidToken, decode_token

# The one UNAUTHENTICATED error of the project; re-exported for the adapters.
from core.errors import Unauthenticated as Unauthenticated

BEARER_SCHEME = "bearer"


# One row always (the VALUES row), LEFT JOINed with the token generation, the
# user with exactly this email (unique: migration xmc.0003) and its groups.
_IDENTITY_SQL = """
SELECT g.generation, u.id, u.is_active, u.is_staff, grp.name
FROM (SELECT %s::text AS email) AS q
LEFT JOIN xmc_tokengeneration g ON g.email = q.email
LEFT JOIN auth_user u ON u.email = q.email
LEFT JOIN auth_user_groups ug ON ug.user_id = u.id
LEFT JOIN auth_group grp ON grp.id = ug.group_id
"""


#: What one lookup learns: the email's current token generation, and the
#: identity (or the refusal of a deactivated account).
Lookup = tuple[int, "Identity | Unauthenticated"]


def _lookup(email: str) -> Lookup:
    """The one query behind an identity (``email`` already normalized)."""
    with connection.cursor() as cursor:
        cursor.execute(_IDENTITY_SQL, [email])
        rows = cursor.fetchall()
    generation = int(rows[0][0] or 0)
    if rows[0][1] is None:
        return generation, Identity(email=email)
    if not rows[0][2]:
        return generation, Unauthenticated(f"the account {email} is deactivated")
    groups = frozenset(name for *_, name in rows if name)
    return generation, Identity(email=email, is_staff=bool(rows[0][3]), groups=groups)


def _resolve(email: str, found: Lookup, token_generation: int | None) -> Identity:
    generation, outcome = found
    if token_generation is not None and token_generation < generation:
        raise Unauthenticated(f"the token for {email} was revoked; sign in again (xmanager login)")
    if isinstance(outcome, Unauthenticated):
        raise Unauthenticated(str(outcome))
    return outcome


def identity_for_email(email: str, *, token_generation: int | None = None) -> Identity:
    """Build the `Identity` for a verified email, with one database query (uncached).

    The Django user is matched on the stored normalized email, exactly (one
    user per email: a unique index). No user means "not staff, no groups" --
    a token for a service account needs no Django user, and the token of a
    deleted user keeps only what ACLs grant its email -- but a deactivated
    user is refused. ``token_generation`` (from the token) below the email's
    current generation means the token was revoked (`xmc.auth.services.do_revoke_tokens`).
    """
    email = normalize_email(email)
    return _resolve(email, _lookup(email), token_generation)


class IdentityCache:
    """What `identity_for_email` reads, remembered per email for ``XMC_IDENTITY_CACHE_S`` seconds.

    The cached value is the lookup (token generation and identity or
    refusal), so a refused caller costs no query per call either, and a
    revoked token is refused as soon as its entry is read again.
    ``XMC_IDENTITY_CACHE_S=0`` turns caching off. Bounded: past
    ``max_entries`` emails it starts over. The clock is injectable for tests.
    """

    def __init__(self, load: Callable[[str], Lookup], *, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self._max_entries = max_entries
        self.clock = clock
        self._entries: dict[str, tuple[float, Lookup]] = {}
        self._lock = threading.Lock()

    def lookup(self, email: str, *, token_generation: int | None = None) -> Identity:
        key = normalize_email(email)
        ttl_s: float = settings.XMC_IDENTITY_CACHE_S
        if ttl_s <= 0:
            return _resolve(key, self._load(key), token_generation)
        now = self.clock()
        entry = self._entries.get(key)
        if entry is None or entry[0] <= now:
            found = self._load(key)
            with self._lock:
                if len(self._entries) >= self._max_entries:
                    self._entries.clear()
                self._entries[key] = (now + ttl_s, found)
        else:
            found = entry[1]
        return _resolve(key, found, token_generation)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


#: The process-wide cache `authenticate_bearer` reads identities through.
IDENTITY_CACHE = IdentityCache(_lookup)


def clear_identity_cache(*_args: object, **_kwargs: object) -> None:
    """Forget every cached identity (user and group changes, `xmc.apps`; revocations)."""
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
    token = bearer_token_from_header(authorization_header_value)
    try:
        claims = decode_token(token)
    except InvalidToken as exc:
        raise Unauthenticated(f"invalid bearer token: {exc}") from exc
    if admit is not None:
        admit(claims.email)
    return IDENTITY_CACHE.lookup(claims.email, token_generation=claims.generation)


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
