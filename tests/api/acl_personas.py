"""Database users behind the ACL personas, for the transport matrices.

Over the wire the identity comes from a token and the Django user with that
email (staff flag, groups), so the personas need real users.
"""
from __future__ import annotations

from django.contrib.auth.models import Group, User

from tests.api.acl_cases import PERSONAS
from xmc.auth.tokens import issue_token


def persona_tokens() -> dict[str, str]:
    """Create the personas' users; return persona name -> bearer token."""
    tokens = {}
    for name, (identity, _) in PERSONAS.items():
        user, _ = User.objects.get_or_create(username=name, defaults={"email": identity.email,
                                                                      "is_staff": identity.is_staff})
        for group in identity.groups:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
        tokens[name] = issue_token(identity.email)
    return tokens
