"""Permission first (AIP-211): who may learn that a resource exists.

The handlers (``xmc.api.handlers``) fetch a resource however they like (one
query on the happy path) and then call these functions, which decide the
answer in one order for every resource kind:

1. the experiment the resource belongs to is missing, or the caller may not
   read it: PERMISSION_DENIED, the same answer whether or not it exists, so a
   stranger learns nothing by probing names (staff, who may read everything,
   get NOT_FOUND instead);
2. the caller may read but needs more (writer, owner): PERMISSION_DENIED
   saying so;
3. only then is a missing child (work unit, operation, artifact) NOT_FOUND.

An artifact's name (``artifacts/{aid}``) does not name its experiment, so a
missing artifact is PERMISSION_DENIED for everyone but staff.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.errors import NotFound, PermissionDenied
from experiments import acl
from experiments.acl import Role
from xmc.auth.identity import Identity


def _denied(identity: Identity, resource: str, field: str) -> PermissionDenied:
    # The very message `experiments.acl.require` gives for an existing resource:
    # the answer must not differ by a byte between "exists" and "missing".
    return PermissionDenied(f"{identity.email} may not read {resource}", field=field)


def require(identity: Identity, acls: Mapping[str, Any] | None, needed: Role, *, resource: str,
            field: str = "name") -> None:
    """Check ``needed`` on a resource whose experiment has ``acls`` (None: the experiment is missing)."""
    if acls is None:
        if identity.is_staff:
            raise NotFound(f"{resource} not found", field=field)
        raise _denied(identity, resource, field)
    if acl.role_of(identity, acls) < Role.READER:
        raise _denied(identity, resource, field)
    acl.require(identity, acls, needed, resource=resource)


def missing_child(identity: Identity, parent_acls: Mapping[str, Any] | None, needed: Role, *, resource: str,
                  field: str = "name") -> NotFound:
    """The error for a child resource that does not exist, after the parent's permission check.

    Raises the permission error if the caller may not act on the parent;
    otherwise returns the NOT_FOUND to raise.
    """
    require(identity, parent_acls, needed, resource=resource, field=field)
    return NotFound(f"{resource} not found", field=field)
