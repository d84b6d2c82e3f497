"""The one table of input limits, shared by the models and the validators.

Models declare their column lengths from these constants (``max_length=
limits.TITLE``) and `core.limits.check_fields` validates incoming values
against the same numbers before anything is written, so a request can never
reach the database with a value the column refuses (which Postgres answers
with a ``DataError``, and the API would answer with INTERNAL).

Who calls it: ``core.convert`` (every ``*_fields`` builder), the work unit
create path (``jobsets.validation``), and the API registry
(``xmc.api.registry.invoke``), which refuses NUL characters in any string of
any request (Postgres ``text`` and ``jsonb`` cannot store U+0000).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from core.errors import InvalidArgument

#: An email address (RFC 5321 path limit) -- creators, requesters, audit emails.
EMAIL = 320
#: Experiment title.
TITLE = 1024
#: One tag of an experiment, work unit or artifact.
TAG = 256
#: How many tags one resource may carry.
TAGS = 1000
#: Free-text notes (a ``text`` column; the limit keeps rows reasonable).
NOTES = 64 * 1024
#: Artifact MIME type.
MIME_TYPE = 256
#: Experiment launch id.
LAUNCH_ID = 256
#: The largest explicit work unit id a client may choose. Far below int64's
#: maximum (2**63 - 1) so the automatic allocator (``last_wid + 1``) can never
#: overflow the ``bigint`` column, however many work units follow.
MAX_WORK_UNIT_ID = 2**53 - 1
#: The largest id in a resource name (a Postgres ``bigint``).
MAX_ID = 2**63 - 1

#: Model field name -> (limit on the string, or on each item of a list; limit on the list length).
FIELD_LIMITS: Mapping[str, tuple[int, int | None]] = {
    "title": (TITLE, None),
    "notes": (NOTES, None),
    "tags": (TAG, TAGS),
    "mime_type": (MIME_TYPE, None),
    "launch_id": (LAUNCH_ID, None),
}


def check_text(value: str, field: str, limit: int) -> None:
    """INVALID_ARGUMENT naming ``field`` when ``value`` is longer than ``limit`` or holds NUL."""
    if len(value) > limit:
        raise InvalidArgument(f"{field} is {len(value)} characters long; at most {limit} are allowed", field=field)
    if "\x00" in value:
        raise InvalidArgument(f"{field} must not contain NUL characters", field=field)


def check_fields(fields: Mapping[str, Any], prefix: str) -> None:
    """Check the string and string-list values of model ``fields`` against `FIELD_LIMITS`."""
    for name, value in fields.items():
        limit = FIELD_LIMITS.get(name)
        if limit is None:
            continue
        each, count = limit
        if isinstance(value, str):
            check_text(value, f"{prefix}.{name}", each)
        elif isinstance(value, (list, tuple)):
            if count is not None and len(value) > count:
                raise InvalidArgument(f"{prefix}.{name} has {len(value)} items; at most {count} are allowed",
                                      field=f"{prefix}.{name}")
            for i, item in enumerate(value):
                check_text(str(item), f"{prefix}.{name}[{i}]", each)


_MAX_DEPTH = 64


def reject_nul(message: Message, prefix: str = "", _depth: int = 0) -> None:
    """INVALID_ARGUMENT naming the field when any string in ``message`` (at any depth) holds U+0000."""
    if _depth > _MAX_DEPTH:
        raise InvalidArgument(f"{prefix or 'request'} is nested too deeply", field=prefix or None)
    for fd, value in message.ListFields():
        path = f"{prefix}.{fd.name}" if prefix else fd.name
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    if isinstance(key, str) and "\x00" in key:
                        raise InvalidArgument(f"{path} keys must not contain NUL characters", field=path)
                    if isinstance(item, Message):
                        reject_nul(item, f"{path}[{key!r}]", _depth + 1)
                    elif isinstance(item, str) and "\x00" in item:
                        raise InvalidArgument(f"{path} must not contain NUL characters", field=path)
            elif fd.is_repeated:
                for i, item in enumerate(value):
                    reject_nul(item, f"{path}[{i}]", _depth + 1)
            else:
                reject_nul(value, path, _depth + 1)
        elif fd.type == FieldDescriptor.TYPE_STRING:
            items = value if fd.is_repeated else [value]
            for item in items:
                if "\x00" in item:
                    raise InvalidArgument(f"{path} must not contain NUL characters", field=path)
