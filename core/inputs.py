"""The one input layer: ids, integers, text and JSON from a request, checked before anything uses them.

Who calls it: the REST transcoding (`xmc.api.rest`: JSON bodies), the
staff-only scheduling switch, the metrics write path (`xmc.api.metrics_write`),
the execution logs and the pages' ids (``k8s_bridge.logs.views``,
``ui.views``), the web's input middleware (`xmc.inputs`: every path, query
parameter and form field) and, through `core.limits.reject_nul`, every
gRPC and REST request message.

Why one layer: Python's own conversions accept more than a client should
send (``int("٣") == 3``; ``int`` of more than 4,300 digits raises
``ValueError`` from deep inside a view; ``json.loads`` recurses until
``RecursionError`` and gives back lone surrogates such as ``"\\ud800"``,
which Postgres and UTF-8 cannot store). Every refusal here is
``INVALID_ARGUMENT`` naming the field (HTTP 400), never a 500.
"""
from __future__ import annotations

import json
import re
from typing import Any

from core import limits
from core.errors import InvalidArgument

#: ASCII digits only (``\d`` matches every Unicode digit), 19 at most: an id fits a ``bigint``.
_ID = re.compile(r"[0-9]{1,19}")
#: An optional sign and at most 20 ASCII digits: anything in int64 or uint64, nothing near the 4,300-digit limit.
_INT = re.compile(r"[-+]?[0-9]{1,20}")
#: How deep a JSON body may nest (objects and arrays); our deepest message is far shallower.
MAX_JSON_DEPTH = 32
#: The longest integer literal a JSON body may hold (digits): far above any number a field takes (a
#: larger one is refused naming its field), far below the 4,300 digits where Python's int() raises.
MAX_JSON_INT_DIGITS = 1000
#: The longest text (a query value, a form field) the input middleware lets through.
MAX_TEXT = 64 * 1024


def parse_id(value: str, field: str, *, maximum: int = limits.MAX_ID) -> int:
    """A positive resource id written in ASCII digits, at most ``maximum``."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise InvalidArgument(f"{field} must be a positive integer in ASCII digits (got {str(value)[:40]!r})",
                              field=field)
    number = int(value)
    if not 0 < number <= maximum:
        raise InvalidArgument(f"{field} must be between 1 and {maximum}", field=field)
    return number


def parse_int(value: Any, field: str, *, low: int = -(2**63), high: int = 2**63 - 1) -> int:
    """An integer from JSON (an int) or text (ASCII digits, optional sign), within ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidArgument(f"{field} must be an integer", field=field)
    if isinstance(value, str):
        text = value.strip()
        if _INT.fullmatch(text) is None:
            raise InvalidArgument(f"{field} must be an integer in ASCII digits (got {value[:40]!r})", field=field)
        value = int(text)
    if not low <= value <= high:
        raise InvalidArgument(f"{field} is out of range [{low}, {high}]", field=field)
    return int(value)


def check_text(value: str, field: str, *, limit: int = MAX_TEXT) -> str:
    """``value`` if it is storable text: no NUL, no lone surrogate, at most ``limit`` characters."""
    if len(value) > limit:
        raise InvalidArgument(f"{field} is {len(value)} characters long; at most {limit} are allowed", field=field)
    if "\x00" in value:
        raise InvalidArgument(f"{field} must not contain NUL characters", field=field)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{field} must not contain lone surrogates (not valid Unicode text)",
                                  field=field) from None
    return value


def parse_json(raw: bytes | str, field: str = "request body", *, max_depth: int = MAX_JSON_DEPTH,
               root: str = "") -> Any:
    """A JSON document: UTF-8, nested at most ``max_depth`` deep, integers of bounded length, strings
    (keys too) without NUL or lone surrogates, a refused string named from ``root`` (``artifact.notes``).
    An empty body is ``None``."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"the {field} is not UTF-8: {exc}") from None
    if not raw.strip():
        return None
    _check_depth(raw, field, max_depth)
    try:
        data = json.loads(raw, parse_int=_json_int(field))
    except ValueError as exc:  # JSONDecodeError is one
        raise InvalidArgument(f"the {field} is not valid JSON: {exc}") from None
    _check_strings(data, field, root)
    return data


def _json_int(field: str) -> Any:
    def parse(text: str) -> int:
        if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
            raise InvalidArgument(f"the {field} holds an integer of {len(text)} digits; at most "
                                  f"{MAX_JSON_INT_DIGITS} are allowed")
        return int(text)

    return parse


def _check_depth(text: str, field: str, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` before the parser recurses into it."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                raise InvalidArgument(f"the {field} is nested more than {max_depth} levels deep")
        elif char in "]}":
            depth -= 1


def _check_strings(data: Any, field: str, root: str) -> None:
    """Every string and key storable; a refusal names its place (``artifact.notes``, ``points[3].metric``)."""
    stack: list[tuple[str, Any]] = [(root, data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            check_text(item, where or field, limit=len(item))
        elif isinstance(item, dict):
            for key, value in item.items():
                check_text(key, f"a key of {where or field}", limit=len(key))
                stack.append((f"{where}.{key}" if where else key, value))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", value) for i, value in enumerate(item))
