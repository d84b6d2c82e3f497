"""Label and field selectors of the simulated API server.

Parsed once per list/watch request by `simulators.cluster.store.Store` and then
applied to each object.  The grammar is the one of Kubernetes' string form:
``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``,
``k>1``/``k<1`` for labels; ``f=v``, ``f==v``, ``f!=v`` for fields; a comma
means AND.  Syntax errors raise `ValueError` (the store turns them into 400).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

LabelMatcher = Callable[[dict[str, str]], bool]
FieldMatcher = Callable[[dict[str, Any]], bool]

_KEY_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _check_key(key: str) -> str:
    if not _KEY_RE.match(key):
        raise ValueError(f"invalid label key {key!r}")
    return key


def _label_in(key: str, values: set[str], negate: bool) -> LabelMatcher:
    def match(labels: dict[str, str]) -> bool:
        return (labels.get(key) in values) != negate

    return match


def _label_eq(key: str, value: str, negate: bool) -> LabelMatcher:
    def match(labels: dict[str, str]) -> bool:
        return (labels.get(key) == value) != negate

    return match


def _label_cmp(key: str, bound: int, greater: bool) -> LabelMatcher:
    def match(labels: dict[str, str]) -> bool:
        value = _int_or_none(labels.get(key))
        if value is None:
            return False
        return value > bound if greater else value < bound

    return match


def _label_exists(key: str, negate: bool) -> LabelMatcher:
    def match(labels: dict[str, str]) -> bool:
        return (key in labels) != negate

    return match


def parse_label_selector(text: str | None) -> LabelMatcher | None:
    """A predicate over an object's labels, or None for "everything"."""
    if not text or not text.strip():
        return None
    reqs: list[LabelMatcher] = []
    for part in _split_top_level(text):
        m = re.match(r"^(\S+)\s+(in|notin)\s*\((.*)\)$", part)
        if m:
            values = {v.strip() for v in m.group(3).split(",") if v.strip()}
            reqs.append(_label_in(_check_key(m.group(1)), values, negate=m.group(2) == "notin"))
            continue
        m = re.match(r"^([^=!<>\s]+)\s*(==|=|!=|>|<)\s*(\S*)$", part)
        if m:
            key, op, value = _check_key(m.group(1)), m.group(2), m.group(3)
            if op in ("=", "==", "!="):
                reqs.append(_label_eq(key, value, negate=op == "!="))
            else:
                reqs.append(_label_cmp(key, int(value), greater=op == ">"))
            continue
        if part.startswith("!"):
            reqs.append(_label_exists(_check_key(part[1:].strip()), negate=True))
            continue
        reqs.append(_label_exists(_check_key(part), negate=False))
    return lambda labels: all(r(labels) for r in reqs)


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _unescape(value: str) -> str:
    out: list[str] = []
    it = iter(value)
    for ch in it:
        if ch == "\\":
            out.append(next(it, ""))
        else:
            out.append(ch)
    return "".join(out)


def _split_fields(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            cur.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def field_value(obj: dict[str, Any], path: str) -> str:
    """The string value a field selector compares against ("" when absent)."""
    if path == "source":  # events: source.component
        return str((obj.get("source") or {}).get("component") or "")
    cur: Any = obj
    for seg in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(seg)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _field_eq(field: str, value: str, negate: bool) -> FieldMatcher:
    def match(obj: dict[str, Any]) -> bool:
        return (field_value(obj, field) == value) != negate

    return match


def parse_field_selector(text: str | None, supported: tuple[str, ...]) -> FieldMatcher | None:
    """A predicate over a whole object, or None.

    Raises ValueError("field label not supported: X") for a field outside
    `supported` (metadata.name and metadata.namespace are always supported).
    """
    if not text or not text.strip():
        return None
    allowed = {"metadata.name", "metadata.namespace", *supported}
    reqs: list[FieldMatcher] = []
    for part in _split_fields(text):
        m = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise ValueError(f"invalid selector: '{part}'; can't understand '{part}'")
        field, op, value = m.group(1).strip(), m.group(2), _unescape(m.group(3))
        if field not in allowed:
            raise ValueError(f"field label not supported: {field}")
        reqs.append(_field_eq(field, value, negate=op == "!="))
    return lambda obj: all(r(obj) for r in reqs)
