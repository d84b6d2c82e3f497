"""Resource names (AIP-122): the one owner of their shapes, how to read them and how to write them.

``experiments/{xid}``, ``experiments/{xid}/workUnits/{wid}``,
``experiments/{xid}[/workUnits/{wid}]/operations/{id}``, ``artifacts/{aid}``.
An id is 1 to 19 ASCII digits ("[0-9]", not "\\d", which matches every Unicode
digit such as "٣") and at most ``core.limits.MAX_ID``; a name must match as a
whole (``fullmatch``: a "$" would also accept a trailing newline). Anything
else is ``INVALID_ARGUMENT`` naming the field and the shape it must have.

:class:`IdConverter` is the same id as a Django path converter, for the pages'
and the REST routes' ``<id:xid>``; :class:`SlugConverter` a chart's or a
dashboard's id (``<slug_id:chart_id>``). `register_converters` registers both.
"""
from __future__ import annotations

import re

from django.urls import converters, register_converter

from core import limits
from core.errors import InvalidArgument

#: One id, captured.
ID = r"([0-9]{1,19})"
#: A chart's or a dashboard's id: a letter or digit, then letters, digits, "_" and "-" (63 at most).
SLUG = r"([A-Za-z0-9][A-Za-z0-9_-]{0,62})"

EXPERIMENT = re.compile(rf"experiments/{ID}")
WORK_UNIT = re.compile(rf"experiments/{ID}/workUnits/{ID}")
ARTIFACT = re.compile(rf"artifacts/{ID}")
OPERATION = re.compile(rf"experiments/{ID}(?:/workUnits/{ID})?/operations/{ID}")


def match(pattern: re.Pattern[str], value: str, field: str, shape: str) -> re.Match[str]:
    """``value`` matched as a whole by ``pattern``, every id in range; else INVALID_ARGUMENT on ``field``."""
    found = pattern.fullmatch(value or "")
    if found is None:
        raise InvalidArgument(f"{field} must look like {shape!r} (got {value[:200]!r})", field=field)
    if any(int(group) > limits.MAX_ID for group in found.groups() if group is not None):
        raise InvalidArgument(f"{field}: an id is larger than {limits.MAX_ID}", field=field)
    return found


def parse_experiment(name: str, field: str = "name") -> int:
    return int(match(EXPERIMENT, name, field, "experiments/{xid}").group(1))


def parse_work_unit(name: str, field: str = "name") -> tuple[int, int]:
    found = match(WORK_UNIT, name, field, "experiments/{xid}/workUnits/{wid}")
    return int(found.group(1)), int(found.group(2))


def parse_parent(parent: str, field: str = "parent") -> tuple[int, int | None]:
    """``experiments/{xid}`` or ``experiments/{xid}/workUnits/{wid}``."""
    if WORK_UNIT.fullmatch(parent or ""):
        return parse_work_unit(parent, field)
    return parse_experiment(parent, field), None


def parse_operation(name: str, field: str = "name") -> tuple[int, int | None, int]:
    """``experiments/{xid}[/workUnits/{wid}]/operations/{id}`` -> ``(xid, wid or None, id)``."""
    found = match(OPERATION, name, field, "experiments/{xid}[/workUnits/{wid}]/operations/{id}")
    return int(found.group(1)), None if found.group(2) is None else int(found.group(2)), int(found.group(3))


def parse_artifact(name: str, field: str = "name") -> int:
    return int(match(ARTIFACT, name, field, "artifacts/{aid}").group(1))


def experiment_name(xid: int) -> str:
    return f"experiments/{xid}"


def work_unit_name(xid: int, wid: int) -> str:
    return f"experiments/{xid}/workUnits/{wid}"


class IdConverter:
    """A Django path converter for one id (``<id:xid>``): `ID`'s digits, at most ``core.limits.MAX_ID``."""

    regex = ID[1:-1]

    def to_python(self, value: str) -> int:
        number = int(value)
        if number > limits.MAX_ID:
            raise ValueError(value)  # Django answers 404, as for any path that matches no route
        return number

    def to_url(self, value: int) -> str:
        return str(value)


class SlugConverter:
    """A Django path converter for a chart's or a dashboard's id (``<slug_id:chart_id>``): `SLUG`, as text."""

    regex = SLUG[1:-1]

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


def register_converters() -> None:
    """``<id:...>`` and ``<slug_id:...>`` for the URL patterns (once per process: the URL modules call it)."""
    for converter, name in ((IdConverter, "id"), (SlugConverter, "slug_id")):
        if name not in converters.get_converters():
            register_converter(converter, name)
