"""DRF adapter of the identity layer: bearer authentication and the per-identity throttle.

The REST API (``/v1/...``) sets, per view or in ``REST_FRAMEWORK``::

    authentication_classes = [xmc.auth.drf.BearerAuthentication]
    permission_classes = [rest_framework.permissions.IsAuthenticated]
    throttle_classes = [xmc.auth.drf.IdentityRateThrottle]

`xmc.auth.drf.BearerAuthentication` calls the same verifier as gRPC
(`xmc.auth.identity.authenticate_bearer`) and puts an
`xmc.auth.drf.IdentityUser` on ``request.user``; views pass
``request.user.identity`` to the services. `xmc.auth.drf.IdentityRateThrottle`
meters the same per-identity bucket as the gRPC interceptor
(`core.ratelimit.check_rate`), so REST and gRPC calls share one budget.
"""
from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from core.ratelimit import check_rate
from xmc.auth.identity import BEARER_SCHEME, Identity, Unauthenticated, authenticate_bearer


class IdentityUser:
    """``request.user`` for a bearer-authenticated request: an `Identity` in user clothes.

    Not a database model: it has no ``pk`` and is never saved. It carries what
    DRF and our permission checks read.
    """

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_superuser = False

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    @property
    def email(self) -> str:
        return self.identity.email

    @property
    def username(self) -> str:
        return self.identity.email

    @property
    def is_staff(self) -> bool:
        return self.identity.is_staff

    @property
    def groups(self) -> frozenset[str]:
        return self.identity.groups

    def get_username(self) -> str:
        return self.identity.email

    def __str__(self) -> str:
        return self.identity.email

    def __repr__(self) -> str:
        return f"IdentityUser({self.identity!r})"


class BearerAuthentication(BaseAuthentication):
    """``Authorization: Bearer <JWT>`` -> `IdentityUser`.

    No header (or another scheme) -> ``None``, so DRF tries the next class or
    answers 401 with ``WWW-Authenticate: Bearer`` when the view needs a user. A
    bearer token that does not verify -> 401 with the reason.
    """

    def authenticate(self, request: Request) -> tuple[IdentityUser, str] | None:
        header: str | None = request.META.get("HTTP_AUTHORIZATION")
        if not header or header.strip().partition(" ")[0].lower() != BEARER_SCHEME:
            return None
        try:
            identity = authenticate_bearer(header)
        except Unauthenticated as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from exc
        token = header.strip().partition(" ")[2].strip()
        return IdentityUser(identity), token

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class IdentityRateThrottle(BaseThrottle):
    """429 once the caller's per-identity bucket is empty (shared with gRPC).

    Requests without a bearer identity are not metered here: the API refuses
    them before throttling (DRF checks permissions first).
    """

    def __init__(self) -> None:
        self._retry_after_s: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        user = getattr(request, "user", None)
        if not isinstance(user, IdentityUser):
            return True
        decision = check_rate(user.identity.email)
        self._retry_after_s = None if decision.allowed else decision.retry_after_s
        return decision.allowed

    def wait(self) -> float | None:
        return self._retry_after_s
