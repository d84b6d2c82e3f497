"""Shared cast for the listing tests: a handful of auth.User personas.

The app's own models are written elsewhere, so these tests run the list
machinery over Django's built-in ``auth.User`` on real Postgres, standing in
for a resource:

* ``name`` -> username (string), ``email`` -> email (string)
* ``state`` -> first_name, holding enum names (RUNNING, PENDING, FAILED)
* ``tags`` -> a real Postgres text[] made from last_name with
  ``string_to_array(last_name, ',')`` (annotation, so no migration)
* ``staff`` / ``status.active`` -> is_staff / is_active (bool)
* ``id`` (int), ``create_time`` -> date_joined, ``status.last_login`` ->
  last_login (timestamps; last_login may be NULL)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User
from django.contrib.postgres.fields import ArrayField
from django.db.models import F, Func, QuerySet, TextField, Value

from xmc.listing import FilterField

UTC = dt.UTC

STATES = ("RUNNING", "PENDING", "FAILED")

FIELDS: dict[str, FilterField] = {
    "name": FilterField("username", "string"),
    "email": FilterField("email", "string"),
    "state": FilterField.for_enum(
        "first_name",
        STATES,
        numbers={1: "PENDING", 4: "RUNNING", 11: "FAILED"},
        aliases={"WORK_UNIT_STATE_RUNNING": "RUNNING"},
    ),
    "tags": FilterField("tags", "string_list"),
    "staff": FilterField("is_staff", "bool"),
    "status.active": FilterField("is_active", "bool"),
    "id": FilterField("id", "int"),
    "create_time": FilterField("date_joined", "timestamp"),
    "status.last_login": FilterField("last_login", "timestamp"),
}

ORDERABLE: dict[str, str] = {
    "name": "username",
    "email": "email",
    "state": "first_name",
    "staff": "is_staff",
    "id": "id",
    "create_time": "date_joined",
    "status.last_login": "last_login",
}


def users() -> QuerySet[User]:
    """auth.User with a real text[] ``tags`` column for string_list filters."""
    return User.objects.annotate(
        tags=Func(F("last_name"), Value(","), function="string_to_array", output_field=ArrayField(TextField()))
    )


@dataclass(frozen=True)
class Persona:
    username: str
    email: str
    state: str
    tags: str
    staff: bool
    active: bool
    joined: dt.datetime
    last_login: dt.datetime | None


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


# fmt: off
CAST: tuple[Persona, ...] = (
    Persona("alice", "alice@example.com", "RUNNING", "ckpt,edge", True, True, ts("2026-01-05T10:00:00Z"), ts("2026-02-01T00:00:00Z")),
    Persona("bob", "bob@example.com", "FAILED", "ckpt", False, True, ts("2025-12-31T23:59:59Z"), None),
    Persona("carol", "carol@corp.example", "PENDING", "", False, True, ts("2026-01-01T00:00:00Z"), ts("2026-01-02T00:00:00Z")),
    Persona("edge-runner", "edge@example.com", "RUNNING", "edge,gpu", True, False, ts("2026-03-01T12:00:00Z"), None),
    Persona("Edgar", "EDGAR@EXAMPLE.COM", "", "gpu", False, True, ts("2026-01-01T00:00:00.500000Z"), ts("2026-01-01T00:00:00Z")),
    Persona("o'brien", 'say "hi"', "PENDING", "ckpt,gpu", False, True, ts("2026-01-10T08:30:00Z"), None),
    Persona("star*name", "star@example.com", "FAILED", "edge", True, True, ts("2026-01-20T00:00:00Z"), ts("2026-01-21T00:00:00Z")),
    Persona("zoë", "zoe@example.com", "RUNNING", "ünïcode", False, True, ts("2026-02-14T14:14:14Z"), None),
)
# fmt: on


def save_persona(p: Persona) -> User:
    # bulk_create: no save signals, so the emails stay exactly as written (the
    # app normalizes real users' emails on save; these rows are stand-ins for a
    # resource with odd strings, e.g. 'say "hi"' and upper case).
    [user] = User.objects.bulk_create([User(
        username=p.username,
        email=p.email,
        first_name=p.state,
        last_name=p.tags,
        is_staff=p.staff,
        is_active=p.active,
        date_joined=p.joined,
        last_login=p.last_login,
    )])
    return user


@pytest.fixture
def cast(db: None) -> dict[str, User]:
    """The personas above, saved; keyed by username."""
    return {p.username: save_persona(p) for p in CAST}
