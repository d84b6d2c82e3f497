"""Property: for random filters, Postgres (through the compiled Q) and a plain
Python evaluator of the documented semantics select the same rows.

Hypothesis builds a filter as a small tree (comparisons joined by AND,
juxtaposition, OR, NOT and ``-``), renders it to AIP-160 text with random
quoting, spacing and redundant parentheses, relying on AIP-160's precedence
(OR binds tighter than AND) where it leaves parentheses out. The evaluator
never sees the text: it walks the tree, so a parser or precedence mistake
shows up as a disagreement.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Union

import pytest
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.listing.conftest import CAST, FIELDS, Persona, save_persona, ts, users
from xmc.listing import compile_filter

EXTRA: tuple[Persona, ...] = tuple(
    Persona(
        username=f"u{i}.{'edge' if i % 3 == 0 else 'bob'}",
        email=f"u{i}@{'EXAMPLE.com' if i % 2 else 'corp.example'}",
        state=("RUNNING", "PENDING", "FAILED", "")[i % 4],
        tags=",".join(t for j, t in enumerate(("ckpt", "edge", "gpu")) if (i >> j) & 1),
        staff=i % 3 == 1,
        active=i % 5 != 2,
        joined=CAST[i % len(CAST)].joined + dt.timedelta(seconds=(i % 3) - 1),
        last_login=None if i % 2 else CAST[i % len(CAST)].joined,
    )
    for i in range(12)
)

# fmt: off
STRING_ATOMS = [
    "alice", "bob", "edge", "Edg", "EDGE", "e", "r", "a", "o'brien", 'say "hi"', "star*name",
    "example.com", "@", "", "x", "u1", "corp", "-", "EXAMPLE",
]
# fmt: on
STATE_VALUES = ["RUNNING", "PENDING", "FAILED", "4", "1", "11", "WORK_UNIT_STATE_RUNNING"]
STATE_NUMBERS = {"4": "RUNNING", "1": "PENDING", "11": "FAILED", "WORK_UNIT_STATE_RUNNING": "RUNNING"}
TAG_VALUES = ["ckpt", "edge", "gpu", "ünïcode", "zzz"]
TIME_POINTS = sorted({p.joined for p in CAST + EXTRA} | {ts("2026-01-01T00:00:00Z"), ts("2027-01-01T00:00:00Z")})
BARE = re.compile(r"[A-Za-z0-9_@*]+(\.[A-Za-z0-9_@*]+)*")


@dataclass(frozen=True)
class Cmp:
    field: str
    op: str
    value: tuple[str, ...] | str | bool | int | dt.datetime  # segments for strings; "*" = presence
    quote: str  # "", '"' or "'"
    spaced: bool


@dataclass(frozen=True)
class And:
    parts: tuple[Node, ...]
    explicit: bool
    parens: bool


@dataclass(frozen=True)
class Or:
    parts: tuple[Node, ...]
    parens: bool


@dataclass(frozen=True)
class Not:
    part: Node
    dash: bool


Node = Union[Cmp, And, Or, Not]


# --- rendering -----------------------------------------------------------------------------


def quote(text_segments: tuple[str, ...], q: str) -> str:
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace(q, "\\" + q).replace("*", "\\*")

    return q + "*".join(esc(s) for s in text_segments) + q


def render_value(c: Cmp) -> str:
    v = c.value
    if v == "*":
        return "*" if not c.quote else f"{c.quote}*{c.quote}"
    if isinstance(v, tuple):
        joined = "*".join(v)
        if not c.quote and BARE.fullmatch(joined) and not any("*" in s for s in v):
            return joined
        return quote(v, c.quote or '"')
    if isinstance(v, bool):
        return ("true" if v else "false") if not c.quote else ("TRUE" if v else "False")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dt.datetime):
        q = c.quote or '"'
        if c.spaced:
            return q + v.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30))).isoformat() + q
        return q + v.strftime("%Y-%m-%dT%H:%M:%S.%fZ") + q
    return str(v)  # enum names, tags


def render(node: Node) -> str:
    if isinstance(node, Cmp):
        sp = " " if node.spaced else ""
        return f"{node.field}{sp}{node.op}{sp}{render_value(node)}"
    if isinstance(node, Not):
        inner = render(node.part)
        if not isinstance(node.part, (Cmp, Not)):
            inner = f"({inner})"
        return ("-" if node.dash else "NOT ") + inner
    if isinstance(node, Or):
        # OR binds tightest: only AND children need parentheses.
        text = " OR ".join(f"({render(p)})" if isinstance(p, And) else render(p) for p in node.parts)
        return f"({text})" if node.parens else text
    text = (" AND " if node.explicit else " ").join(render(p) for p in node.parts)
    return f"({text})" if node.parens else text


# --- the reference evaluator ---------------------------------------------------------------------


def row_of(user: User) -> dict[str, object]:
    return {
        "name": user.username,
        "email": user.email,
        "state": user.first_name,
        "tags": user.last_name.split(",") if user.last_name else [],
        "staff": user.is_staff,
        "status.active": user.is_active,
        "id": user.pk,
        "create_time": user.date_joined,
        "status.last_login": user.last_login,
    }


def pattern_match(segments: tuple[str, ...], value: str, ignore_case: bool) -> bool:
    regex = ".*".join(re.escape(s) for s in segments)
    return re.fullmatch(regex, value, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None


def evaluate(node: Node, row: dict[str, object]) -> bool:
    if isinstance(node, Not):
        return not evaluate(node.part, row)
    if isinstance(node, And):
        return all(evaluate(p, row) for p in node.parts)
    if isinstance(node, Or):
        return any(evaluate(p, row) for p in node.parts)
    if node.op == "!=":
        return not evaluate(Cmp(node.field, "=", node.value, node.quote, node.spaced), row)
    actual = row[node.field]
    kind = FIELDS[node.field].kind
    v = node.value
    if v == "*":
        if kind == "string_list":
            return bool(actual)
        if kind in ("string", "enum"):
            return actual is not None and actual != ""
        return actual is not None
    if kind == "string":
        assert isinstance(v, tuple) and isinstance(actual, str)
        if node.op == ":" and len(v) == 1:
            return v[0].lower() in actual.lower()
        if node.op == ":" and all(s == "" for s in v):
            return actual != ""
        return pattern_match(v, actual, ignore_case=node.op == ":")
    if kind == "enum":
        return actual == STATE_NUMBERS.get(str(v), v)
    if kind == "string_list":
        assert isinstance(actual, list)
        return v in actual
    if actual is None:
        return False
    if node.op in ("=", ":"):
        return actual == v
    return {"<": actual < v, "<=": actual <= v, ">": actual > v, ">=": actual >= v}[node.op]  # type: ignore[operator]


# --- strategies ---------------------------------------------------------------------------------


def leaves(ids: list[int]) -> st.SearchStrategy[Cmp]:
    quotes = st.sampled_from(["", '"', "'"])
    spaced = st.booleans()
    segments = st.lists(st.sampled_from(STRING_ATOMS), min_size=1, max_size=3).map(tuple)
    strings = st.builds(
        Cmp, st.sampled_from(["name", "email"]), st.sampled_from(["=", "!=", ":"]), segments, quotes, spaced
    )
    presence = st.builds(
        Cmp, st.sampled_from(sorted(FIELDS)), st.just(":"), st.just("*"), st.sampled_from(["", '"']), spaced
    )
    enums = st.builds(
        Cmp, st.just("state"), st.sampled_from(["=", "!=", ":"]), st.sampled_from(STATE_VALUES), st.just(""), spaced
    )
    tags = st.builds(
        Cmp,
        st.just("tags"),
        st.sampled_from(["=", "!=", ":"]),
        st.sampled_from([*TAG_VALUES, "*"]),
        st.just(""),
        spaced,
    )
    bools = st.builds(
        Cmp,
        st.sampled_from(["staff", "status.active"]),
        st.sampled_from(["=", "!=", ":"]),
        st.booleans(),
        quotes,
        spaced,
    )
    ordered_ops = st.sampled_from(["=", "!=", ":", "<", "<=", ">", ">="])
    times = st.builds(
        Cmp,
        st.sampled_from(["create_time", "status.last_login"]),
        ordered_ops,
        st.sampled_from(TIME_POINTS),
        st.sampled_from(['"', "'"]),
        spaced,
    )
    id_values = st.sampled_from([ids[0] - 1, *ids, ids[-1] + 1])
    ints = st.builds(Cmp, st.just("id"), ordered_ops, id_values, st.just(""), spaced)
    return st.one_of(strings, presence, enums, tags, bools, times, ints)


def trees(ids: list[int]) -> st.SearchStrategy[Node]:
    def extend(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        parts = st.lists(children, min_size=2, max_size=3).map(tuple)
        return st.one_of(
            st.builds(And, parts, st.booleans(), st.booleans()),
            st.builds(Or, parts, st.booleans()),
            st.builds(Not, children, st.booleans()),
        )

    return st.recursive(leaves(ids), extend, max_leaves=8)


@pytest.mark.django_db
def test_it_agrees_with_a_python_evaluator_on_random_filters() -> None:
    saved = [save_persona(p) for p in CAST + EXTRA]
    rows = [row_of(u) for u in saved]
    ids = sorted(u.pk for u in saved)

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(trees(ids))
    def check(tree: Node) -> None:
        text = render(tree)
        expected = {row["id"] for row in rows if evaluate(tree, row)}
        got = set(users().filter(compile_filter(text, FIELDS)).values_list("id", flat=True))
        assert got == expected, text

    check()
