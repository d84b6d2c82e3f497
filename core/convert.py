"""The generic half of the conversion between rows and ``cloud.xmanager.v1`` messages.

Proto3 JSON (``to_json`` / ``from_json``), timestamps, enum names and
``packed_json``: what every app's ``wire.py`` builds on. Each app owns the
conversion of its own rows (``experiments.wire``, ``workunits.wire``,
``artifacts.wire``), so this module imports no app. Nested messages are
stored as proto3 JSON dicts; enums are stored by name.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

from google.protobuf import any_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message

from core.errors import InvalidArgument

M = TypeVar("M", bound=Message)

# --- Generic helpers ------------------------------------------------------------


def to_json(message: Message) -> dict[str, Any]:
    """A message as a proto3 JSON dict (lowerCamelCase names, enums by name)."""
    data: dict[str, Any] = json_format.MessageToDict(message)
    return data


def from_json(cls: type[M], data: Mapping[str, Any] | None, *, field: str = "") -> M:
    message: M = cls()
    if data:
        try:
            json_format.ParseDict(dict(data), message)
        except json_format.ParseError as exc:
            raise InvalidArgument(f"{field or cls.DESCRIPTOR.name}: {exc}", field=field or None) from exc
    return message


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def timestamp_from_ns(ns: int | None) -> timestamp_pb2.Timestamp | None:
    if ns is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(ns)
    return ts


def datetime_from_ns(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)


def ns_from_datetime(value: datetime) -> int:
    return int(value.timestamp()) * 1_000_000_000 + value.microsecond * 1000


def enum_name(enum: Any, number: int, *, field: str, allow_unspecified: bool = False) -> str:
    """The stored name of an enum number, or INVALID_ARGUMENT naming ``field``."""
    try:
        name = str(enum.Name(number))
    except ValueError:
        raise InvalidArgument(f"{field}: {number} is not a valid value", field=field) from None
    if number == 0 and not allow_unspecified:
        raise InvalidArgument(f"{field} must be set (got {name})", field=field)
    return name


def enum_number(enum: Any, name: str) -> int:
    return int(enum.Value(name)) if name else 0


def set_if(message: Message, name: str, value: Message | None) -> None:
    """Copy ``value`` into the field ``name`` of ``message`` unless it is None."""
    if value is not None:
        getattr(message, name).CopyFrom(value)


def parse_list(cls: type[M], items: Iterable[Mapping[str, Any]]) -> list[M]:
    return [from_json(cls, item) for item in items]


def packed_json(message: Message) -> dict[str, Any]:
    """``message`` packed in an Any, as proto3 JSON (what Operation.response stores)."""
    packed = any_pb2.Any()
    packed.Pack(message)
    return to_json(packed)
