"""Access control: who may read, write or own an experiment (``XidAcls``).

One owner for the rule, used by every RPC handler (``xmc.api.handlers``):
readers read; writers also mutate work units and artifacts; owners also
change ACLs; Django staff may do everything. Work units, executions,
operations, messages and artifacts inherit their experiment's ACLs.

Principals: ``user`` and ``service_account`` match the caller's verified
email, ``group`` a Django group name of the caller, ``domain`` the part of
the email after ``@``, ``all_authenticated_users`` anyone with a valid token.
ACL JSON is normalized (emails and domains lower-cased) when stored, so the
database can filter lists by JSON containment.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from django.db.models import Q

from core.errors import PermissionDenied
from core.identity import Identity, normalize_email


class Role(enum.IntEnum):
    NONE = 0
    READER = 1
    WRITER = 2
    OWNER = 3


ROLE_LISTS = (("owners", Role.OWNER), ("writers", Role.WRITER), ("readers", Role.READER))
_LOWERED = ("user", "serviceAccount", "domain")


def normalize_acls(acls: Mapping[str, Any]) -> dict[str, Any]:
    """Normalize emails and domains in proto3-JSON ``XidAcls`` (stored form; `core.identity.normalize_email`)."""
    result: dict[str, Any] = {}
    for key, _ in ROLE_LISTS:
        roles = []
        for role in acls.get(key) or []:
            roles.append({k: (normalize_email(v) if k in _LOWERED and isinstance(v, str) else v) for k, v in role.items()})
        if roles:
            result[key] = roles
    return result


def _principals(identity: Identity) -> list[dict[str, Any]]:
    principals: list[dict[str, Any]] = [
        {"user": identity.email},
        {"serviceAccount": identity.email},
        {"allAuthenticatedUsers": True},
    ]
    if identity.domain:
        principals.append({"domain": identity.domain})
    principals.extend({"group": group} for group in sorted(identity.groups))
    return principals


def _matches(identity: Identity, principal: Mapping[str, Any]) -> bool:
    # A Role holds exactly one principal (a proto oneof), so equality is the match.
    return dict(principal) in _principals(identity)


def role_of(identity: Identity, acls: Mapping[str, Any]) -> Role:
    """The strongest role ``identity`` holds in ``acls`` (staff: OWNER)."""
    if identity.is_staff:
        return Role.OWNER
    for key, role in ROLE_LISTS:
        if any(_matches(identity, principal) for principal in acls.get(key) or []):
            return role
    return Role.NONE


def require(identity: Identity, acls: Mapping[str, Any], needed: Role, *, resource: str) -> None:
    """Raise PERMISSION_DENIED unless ``identity`` holds at least ``needed`` on ``resource``."""
    held = role_of(identity, acls)
    if held < needed:
        verb = {Role.READER: "read", Role.WRITER: "modify", Role.OWNER: "change the ACLs of"}[needed]
        raise PermissionDenied(f"{identity.email} may not {verb} {resource}", field="name")


def readable_q(identity: Identity, prefix: str = "") -> Q:
    """A filter for experiments (or rows under them via ``prefix``) the caller may read."""
    if identity.is_staff:
        return Q()
    condition = Q(pk__in=[])
    for key, _ in ROLE_LISTS:
        for principal in _principals(identity):
            condition |= Q(**{f"{prefix}acls__{key}__contains": [principal]})
    return condition
