"""AIP-160 filters, parsed with Lark and compiled to Django ``Q`` objects.

Called by :func:`xmc.listing.list_page` (and through it by every List*/Search*
RPC and REST list view). The API layer declares, per resource, which filter
fields exist (:class:`FilterField`: the Django lookup and a kind), and
:func:`compile_filter` turns the user's ``filter`` string into a ``Q`` over
those lookups. No SQL text is ever built here: every value reaches the
database as a query parameter through the ORM.

Semantics, chosen and documented in docs/architecture/listing.md:

* Precedence is AIP-160's: ``OR`` binds tightest, then juxtaposition
  (implicit ``AND``), then explicit ``AND``. ``NOT x`` and ``-x`` negate.
* ``=`` is exact (case-sensitive) equality; ``!=`` is its negation (rows with
  NULL count as "not equal"). ``:`` is "has": a case-insensitive substring
  match on strings, membership on ``string_list``, equality elsewhere, and
  ``field:*`` means "present" (non-null and non-empty).
* ``*`` in a string value is a wildcard (any run of characters, possibly
  empty); ``\\*`` inside quotes is a literal asterisk. ``=`` with a wildcard
  is a case-sensitive pattern match, ``:`` with a wildcard is case-insensitive
  and anchored (``title:"edge*"`` is a prefix match).
* ``field = (a OR b)`` applies the comparison to each bare value of the
  parenthesised expression, keeping its AND/OR/NOT structure.
"""

from __future__ import annotations

import datetime as dt
import operator
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache, reduce
from pathlib import Path
from types import MappingProxyType
from typing import Literal, Protocol, get_args

from django.db.models import Q
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from xmc.listing.errors import FilterError

FieldKind = Literal["string", "enum", "int", "bool", "timestamp", "string_list", "number", "mixed"]
FIELD_KINDS: frozenset[str] = frozenset(get_args(FieldKind))

#: Longest accepted filter, in characters. The client passes user input
#: straight through; anything longer is refused before parsing.
MAX_FILTER_LENGTH = 4096
#: Deepest accepted nesting of AND/OR/NOT/parentheses (keeps both our
#: compiler's and Django's recursive SQL compilation far from Python's limit).
MAX_DEPTH = 32
#: Most comparisons accepted in one filter (keeps the generated query cheap).
MAX_COMPARISONS = 100

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_ORDERING_LOOKUPS: Mapping[str, str] = MappingProxyType({"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"})


class _EnumValueDescriptor(Protocol):
    name: str
    number: int


class _EnumDescriptor(Protocol):
    @property
    def values(self) -> Iterable[_EnumValueDescriptor]: ...


@dataclass(frozen=True)
class FilterField:
    """One field a resource can be filtered on.

    ``lookup`` is the Django lookup path (``"status_active_state"``,
    ``"experiment__xid"``, or an annotation name); ``kind`` decides which
    operators and literals are accepted. For ``kind="enum"``, ``enum_names``
    are the names stored in the database (``"RUNNING"``) and ``enum_numbers``
    optionally maps proto enum numbers to those names so ``state=4`` works too.
    ``aliases`` maps alternate spellings a user may write to the stored value;
    it applies to any non-wildcard literal of this field.

    ``kind="number"`` is a float column (``metrics.loss.last < 0.1``).
    ``kind="mixed"`` is a text value that may hold a number (a work unit's
    ``args.lr``): ``lookup`` is the text and ``number_lookup`` the same value
    as a number (NULL when the text is not one); a comparison with a number
    literal compares numbers where the stored value is one and text
    elsewhere, any other literal compares text (all six operators).
    """

    lookup: str
    kind: FieldKind
    enum_names: frozenset[str] = frozenset()
    aliases: Mapping[str, str] = field(default_factory=dict, hash=False)
    enum_numbers: Mapping[int, str] = field(default_factory=dict, hash=False)
    number_lookup: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FIELD_KINDS:
            raise ValueError(f"unknown FilterField kind {self.kind!r}; expected one of {sorted(FIELD_KINDS)}")
        if not self.lookup:
            raise ValueError("FilterField.lookup must not be empty")
        object.__setattr__(self, "enum_names", frozenset(self.enum_names))
        object.__setattr__(self, "aliases", MappingProxyType(dict(self.aliases)))
        object.__setattr__(self, "enum_numbers", MappingProxyType(dict(self.enum_numbers)))
        if self.kind == "enum":
            if not self.enum_names:
                raise ValueError(f"enum FilterField {self.lookup!r} needs enum_names")
            stray = (set(self.aliases.values()) | set(self.enum_numbers.values())) - self.enum_names
            if stray:
                raise ValueError(
                    f"enum FilterField {self.lookup!r}: aliases/numbers name unknown values {sorted(stray)}"
                )
        elif self.enum_names or self.enum_numbers:
            raise ValueError(f"FilterField {self.lookup!r}: enum_names/enum_numbers only apply to kind='enum'")
        if (self.kind == "mixed") != bool(self.number_lookup):
            raise ValueError(f"FilterField {self.lookup!r}: number_lookup is needed by, and only by, kind='mixed'")

    @classmethod
    def for_enum(
        cls,
        lookup: str,
        names: Iterable[str],
        *,
        numbers: Mapping[int, str] | None = None,
        aliases: Mapping[str, str] | None = None,
    ) -> FilterField:
        """An enum field whose database column stores the value names."""
        return cls(lookup, "enum", frozenset(names), dict(aliases or {}), dict(numbers or {}))

    @classmethod
    def for_proto_enum(
        cls, lookup: str, descriptor: _EnumDescriptor, *, aliases: Mapping[str, str] | None = None
    ) -> FilterField:
        """An enum field taking names and numbers from a protobuf ``EnumDescriptor``."""
        values = list(descriptor.values)
        return cls.for_enum(
            lookup, (v.name for v in values), numbers={v.number: v.name for v in values}, aliases=aliases
        )


# --- Parsing -------------------------------------------------------------------

_GRAMMAR_PATH = Path(__file__).with_name("filter_grammar.lark")
# Built once per process: LALR(1) with the contextual lexer parses in linear time.
_PARSER = Lark(_GRAMMAR_PATH.read_text(encoding="utf-8"), parser="lalr", lexer="contextual", start="start")
# Lark builds each lexer state's scanner lazily on first use, without a lock;
# gRPC serves from a thread pool, so uncached parses are serialized. They take
# well under a millisecond, and repeated filters never get here (cache below).
_PARSE_LOCK = threading.Lock()

_TERMINAL_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "TEXT": "a value",
        "STRING": "a quoted string",
        "COMPARATOR": "an operator (= != < <= > >= :)",
        "LPAR": "'('",
        "RPAR": "')'",
        "DOT": "'.'",
        "MINUS": "'-'",
        "NOT": "NOT",
        "AND": "AND",
        "OR": "OR",
        "$END": "the end of the filter",
    }
)


def _expected(names: Iterable[str]) -> str:
    human = sorted({_TERMINAL_NAMES.get(n, n) for n in names})
    return f"; expected {', '.join(human)}" if human else ""


def _syntax_error(text: str, error: UnexpectedInput) -> FilterError:
    if isinstance(error, UnexpectedCharacters):
        pos = error.pos_in_stream or 0  # always set by the lexer; typed Optional
        char = text[pos] if 0 <= pos < len(text) else ""
        if char in ("'", '"'):
            return FilterError(f"invalid filter: unterminated quoted string starting at position {pos + 1}")
        return FilterError(
            f"invalid filter: unexpected character {char!r} at position {pos + 1}{_expected(error.allowed or ())}"
        )
    if isinstance(error, UnexpectedToken):
        token = error.token
        if token.type == "$END":
            return FilterError(f"invalid filter: unexpected end of filter{_expected(error.expected)}")
        return FilterError(
            f"invalid filter: unexpected {str(token)!r} at position {(token.start_pos or 0) + 1}"
            f"{_expected(error.expected)}"
        )
    if isinstance(error, UnexpectedEOF):
        return FilterError(f"invalid filter: unexpected end of filter{_expected(error.expected)}")
    return FilterError(f"invalid filter: {error}")  # pragma: no cover - lark has no other kinds


def _check_shape(tree: Tree[Token]) -> None:
    """Refuse trees nested deeper than MAX_DEPTH or with too many comparisons.

    Iterative on purpose: the tree of a hostile input may be deeper than
    Python's recursion limit, and this runs before anything recursive does.
    """
    comparisons = 0
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise FilterError(f"invalid filter: nested more than {MAX_DEPTH} levels deep")
        if node.data == "restriction":
            comparisons += 1
            if comparisons > MAX_COMPARISONS:
                raise FilterError(f"invalid filter: more than {MAX_COMPARISONS} comparisons")
        if node.data == "comparable":
            continue
        for child in node.children:
            if isinstance(child, Tree):
                stack.append((child, depth + 1))


@lru_cache(maxsize=2048)
def parse_filter(text: str) -> Tree[Token] | None:
    """Parse ``text`` into a Lark tree (``None`` for an empty filter); cached per text.

    Raises FilterError for bad syntax, over-long or over-deep input.
    """
    if len(text) > MAX_FILTER_LENGTH:
        raise FilterError(f"invalid filter: {len(text)} characters long; at most {MAX_FILTER_LENGTH} are allowed")
    if "\x00" in text:
        raise FilterError(f"invalid filter: NUL character at position {text.index(chr(0)) + 1}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate, e.g. from a JSON "\ud800"
        raise FilterError(f"invalid filter: invalid character at position {error.start + 1}") from None
    if not text.strip():
        return None
    try:
        with _PARSE_LOCK:
            tree = _PARSER.parse(text)
    except UnexpectedInput as error:
        raise _syntax_error(text, error) from None
    _check_shape(tree)
    return tree


# --- Literals --------------------------------------------------------------------

_SIMPLE_ESCAPES: Mapping[str, str] = MappingProxyType(
    {'"': '"', "'": "'", "\\": "\\", "n": "\n", "r": "\r", "t": "\t", "*": "*", "/": "/"}
)


_KEYWORDS = frozenset({"AND", "OR", "NOT"})


@dataclass(frozen=True)
class _Literal:
    """A decoded value: its text split at wildcard ``*`` (one segment = no wildcard)."""

    segments: tuple[str, ...]
    pos: int  # 1-based position in the filter, for messages
    source: str  # as written

    @property
    def wildcard(self) -> bool:
        return len(self.segments) > 1

    @property
    def is_star(self) -> bool:
        return all(s == "" for s in self.segments) and self.wildcard

    @property
    def text(self) -> str:
        return self.segments[0]


def _decode_token(token: Token) -> _Literal:
    pos = (token.start_pos or 0) + 1
    raw = str(token)
    if token.type == "TEXT":
        if raw in _KEYWORDS:
            # The contextual lexer reads a keyword where no keyword can go as a word.
            raise FilterError(
                f"invalid filter: unexpected keyword {raw!r} at position {pos} (quote it to use it as a value)"
            )
        return _Literal(tuple(raw.split("*")), pos, raw)
    body = raw[1:-1]
    segments: list[str] = []
    buf: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "*":
            segments.append("".join(buf))
            buf = []
        elif ch == "\\":
            esc = body[i + 1]  # the STRING terminal guarantees a character follows
            if esc in _SIMPLE_ESCAPES:
                buf.append(_SIMPLE_ESCAPES[esc])
                i += 1
            elif esc == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6]):
                code = int(body[i + 2 : i + 6], 16)
                if code == 0 or 0xD800 <= code <= 0xDFFF:
                    raise FilterError(
                        f"invalid filter: escape '\\u{body[i + 2 : i + 6]}' at position {pos + i + 1} is not allowed"
                    )
                buf.append(chr(code))
                i += 5
            else:
                raise FilterError(
                    f"invalid filter: unknown escape '\\{esc}' in quoted string at position {pos + i + 1}"
                    " (allowed: \\\" \\' \\\\ \\n \\r \\t \\* \\/ \\uXXXX)"
                )
        else:
            buf.append(ch)
        i += 1
    segments.append("".join(buf))
    return _Literal(tuple(segments), pos, raw)


def _join_literals(literals: list[_Literal]) -> _Literal:
    """Rejoin a dotted value (``alice@example.com``, ``1.5``) split by the grammar."""
    segments = list(literals[0].segments)
    for lit in literals[1:]:
        segments[-1] = segments[-1] + "." + lit.segments[0]
        segments.extend(lit.segments[1:])
    return _Literal(tuple(segments), literals[0].pos, ".".join(lit.source for lit in literals))


def _comparable_literals(tree: Tree[Token]) -> list[_Literal]:
    return [_decode_token(tok) for tok in tree.children if isinstance(tok, Token)]


# --- Typed values ----------------------------------------------------------------------

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,  # \d is 0-9 only, not every Unicode digit
)
_INT = re.compile(r"-?[0-9]+")
#: A number literal of ``number`` and ``mixed`` fields (``0.01``, ``-3``, ``1e-4``, ``.5``).
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def parse_rfc3339(text: str) -> dt.datetime:
    """An RFC 3339 timestamp (``2026-01-01T00:00:00Z``, offsets allowed) as an aware datetime.

    Raises ValueError for anything else (dates alone, missing offset, bad values).
    """
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError(text)
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    micro = int((m.group(7) or "").ljust(6, "0")[:6] or 0)
    if m.group(8):
        tz = dt.UTC
    else:
        oh, om = int(m.group(10)), int(m.group(11))
        if oh > 23 or om > 59:
            raise ValueError(text)
        delta = dt.timedelta(hours=oh, minutes=om)
        tz = dt.timezone(-delta if m.group(9) == "-" else delta)
    # In UTC: Postgres refuses offsets beyond +-15:59, which RFC 3339 allows.
    try:
        return dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=tz).astimezone(dt.UTC)
    except OverflowError:
        raise ValueError(text) from None


def _pg_regex_escape(text: str) -> str:
    """Escape ASCII punctuation for a Postgres ARE (a backslash before a
    non-alphanumeric character makes it literal); other characters pass as-is."""
    return "".join("\\" + ch if ch.isascii() and not (ch.isalnum() or ch == "_") else ch for ch in text)


# --- Compilation ---------------------------------------------------------------------------


class _Compiler:
    def __init__(self, fields: Mapping[str, FilterField]) -> None:
        self.fields = fields

    def node(self, tree: Tree[Token]) -> Q:
        data = tree.data
        if data == "and_":
            return reduce(operator.and_, (self.node(c) for c in _subtrees(tree)))
        if data == "or_":
            return reduce(operator.or_, (self.node(c) for c in _subtrees(tree)))
        if data == "not_":
            return ~self.node(_subtrees(tree)[0])
        if data == "restriction":
            return self.restriction(tree)
        raise AssertionError(f"unexpected filter node {data!r}")  # pragma: no cover - grammar bug

    def restriction(self, tree: Tree[Token]) -> Q:
        comparable = tree.children[0]
        assert isinstance(comparable, Tree)
        path = _comparable_literals(comparable)
        if len(tree.children) == 1:
            value = _join_literals(path)
            raise FilterError(
                f"invalid filter: {value.source!r} at position {value.pos} is not a comparison; "
                f"write field=value or field:value (allowed fields: {self.allowed()})"
            )
        name = ".".join(lit.source if lit.wildcard else lit.text for lit in path)
        spec = self.fields.get(name)
        if spec is None or any(lit.wildcard for lit in path):
            raise FilterError(f"unknown field {name!r} in filter at position {path[0].pos}; allowed: {self.allowed()}")
        op = str(tree.children[1])
        arg = tree.children[2]
        assert isinstance(arg, Tree)
        if arg.data == "comparable":
            return self.compare(name, spec, op, _join_literals(_comparable_literals(arg)))
        return self.composite_arg(name, spec, op, arg)

    def composite_arg(self, name: str, spec: FilterField, op: str, tree: Tree[Token]) -> Q:
        """``field op (a OR NOT b)``: the comparison applied to each bare value."""
        if tree.data == "restriction":
            if len(tree.children) != 1:
                inner = _comparable_literals(tree.children[0])  # type: ignore[arg-type]
                raise FilterError(
                    f"invalid filter: comparison at position {inner[0].pos} cannot be nested inside "
                    f"the value of {name!r}; use bare values, e.g. {name}=(a OR b)"
                )
            return self.compare(name, spec, op, _join_literals(_comparable_literals(tree.children[0])))  # type: ignore[arg-type]
        parts = [self.composite_arg(name, spec, op, c) for c in _subtrees(tree)]
        if tree.data == "and_":
            return reduce(operator.and_, parts)
        if tree.data == "or_":
            return reduce(operator.or_, parts)
        return ~parts[0]  # not_

    def allowed(self) -> str:
        return ", ".join(sorted(self.fields))

    # -- one comparison -------------------------------------------------------------------

    def compare(self, name: str, spec: FilterField, op: str, lit: _Literal) -> Q:
        if op == "!=":
            return ~self.compare(name, spec, "=", lit)
        if not lit.wildcard and lit.text in spec.aliases:
            lit = _Literal((spec.aliases[lit.text],), lit.pos, lit.source)
        kind = spec.kind
        if kind == "string":
            return self.string(name, spec.lookup, op, lit)
        if kind == "mixed":
            return self.mixed(name, spec, op, lit)
        if kind == "number" and not lit.wildcard:
            return self.number(name, spec.lookup, op, lit)
        if op in _ORDERING_LOOKUPS and kind in ("enum", "bool", "string_list"):
            raise self.bad_operator(name, kind, op, lit)
        if lit.wildcard:
            if lit.is_star and (op == ":" or kind == "string_list"):
                return _present(spec.lookup, kind)
            raise FilterError(
                f"invalid filter: wildcard '*' is not allowed in the value {lit.source!r} for {kind} field "
                f"{name!r} at position {lit.pos} (only {name}:* to test presence)"
            )
        if kind == "string_list":
            return Q(**{f"{spec.lookup}__contains": [lit.text]})
        if kind == "enum":
            return Q(**{spec.lookup: self.enum_value(name, spec, lit)})
        if kind == "bool":
            lowered = lit.text.lower()
            if lowered not in ("true", "false"):
                raise FilterError(
                    f"invalid filter: bool field {name!r} expects true or false, "
                    f"got {lit.source!r} at position {lit.pos}"
                )
            return Q(**{spec.lookup: lowered == "true"})
        value: int | dt.datetime
        if kind == "int":
            if not _INT.fullmatch(lit.text):
                raise FilterError(
                    f"invalid filter: int field {name!r} expects an integer, got {lit.source!r} at position {lit.pos}"
                )
            value = int(lit.text)
            if not INT64_MIN <= value <= INT64_MAX:
                raise FilterError(
                    f"invalid filter: value {lit.source!r} for int field {name!r} at position {lit.pos} is out of range"
                )
        else:  # timestamp
            try:
                value = parse_rfc3339(lit.text)
            except ValueError:
                raise FilterError(
                    f"invalid filter: timestamp field {name!r} expects an RFC 3339 timestamp such as "
                    f'"2026-01-01T00:00:00Z", got {lit.source!r} at position {lit.pos}'
                ) from None
        if op in _ORDERING_LOOKUPS:
            return Q(**{f"{spec.lookup}__{_ORDERING_LOOKUPS[op]}": value})
        return Q(**{spec.lookup: value})

    def string(self, name: str, lookup: str, op: str, lit: _Literal) -> Q:
        if op in _ORDERING_LOOKUPS:
            raise self.bad_operator(name, "string", op, lit)
        insensitive = op == ":"
        i = "i" if insensitive else ""
        if not lit.wildcard:
            return Q(**{f"{lookup}__icontains" if insensitive else lookup: lit.text})
        if lit.is_star:
            if insensitive:  # presence
                return _present(lookup, "string")
            return Q(**{f"{lookup}__isnull": False})  # '*' matches any string
        first, *middle, last = lit.segments
        middle = [m for m in middle if m]
        if not middle and first and not last:
            return Q(**{f"{lookup}__{i}startswith": first})
        if not middle and last and not first:
            return Q(**{f"{lookup}__{i}endswith": last})
        if len(middle) == 1 and not first and not last:
            return Q(**{f"{lookup}__{i}contains": middle[0]})
        pattern = "^" + ".*".join(_pg_regex_escape(s) for s in lit.segments) + "$"
        return Q(**{f"{lookup}__{i}regex": pattern})

    @staticmethod
    def number_value(lit: _Literal) -> float | None:
        """The literal as a finite float, or None when it is not a number."""
        if lit.wildcard or not NUMBER.fullmatch(lit.text):
            return None
        value = float(lit.text)
        return value if value not in (float("inf"), float("-inf")) else None

    def number(self, name: str, lookup: str, op: str, lit: _Literal) -> Q:
        value = self.number_value(lit)
        if value is None:
            raise FilterError(
                f"invalid filter: number field {name!r} expects a number, got {lit.source!r} at position {lit.pos}"
            )
        return Q(**{f"{lookup}__{_ORDERING_LOOKUPS[op]}" if op in _ORDERING_LOOKUPS else lookup: value})

    def mixed(self, name: str, spec: FilterField, op: str, lit: _Literal) -> Q:
        """Numbers as numbers where both sides are numbers, text otherwise (``args.lr < 0.1``)."""
        if lit.wildcard and not (lit.is_star and op == ":"):
            return self.string(name, spec.lookup, op, lit)
        if lit.is_star:
            return _present(spec.lookup, "string")
        value = self.number_value(lit)
        if op in _ORDERING_LOOKUPS:
            suffix = f"__{_ORDERING_LOOKUPS[op]}"
            text = Q(**{f"{spec.lookup}{suffix}": lit.text})
        else:
            suffix = ""
            text = Q(**{f"{spec.lookup}__icontains" if op == ":" else spec.lookup: lit.text})
        if value is None:
            return text
        return Q(**{f"{spec.number_lookup}{suffix}": value}) | (Q(**{f"{spec.number_lookup}__isnull": True}) & text)

    def enum_value(self, name: str, spec: FilterField, lit: _Literal) -> str:
        text = lit.text
        if text in spec.enum_names:
            return text
        if _INT.fullmatch(text) and spec.enum_numbers:
            number = int(text)
            if number in spec.enum_numbers:
                return spec.enum_numbers[number]
        raise FilterError(
            f"invalid filter: {lit.source!r} at position {lit.pos} is not a value of enum field {name!r}; "
            f"allowed: {', '.join(sorted(spec.enum_names))}"
        )

    @staticmethod
    def bad_operator(name: str, kind: str, op: str, lit: _Literal) -> FilterError:
        return FilterError(
            f"invalid filter: operator {op!r} is not supported on {kind} field {name!r} "
            f"(value at position {lit.pos}); use =, != or :"
        )


def _subtrees(tree: Tree[Token]) -> list[Tree[Token]]:
    return [c for c in tree.children if isinstance(c, Tree)]


def _present(lookup: str, kind: str) -> Q:
    """``field:*``: set to something (non-null; non-empty for strings and lists)."""
    if kind == "string_list":
        return Q(**{f"{lookup}__len__gt": 0})
    if kind in ("string", "enum"):
        return Q(**{f"{lookup}__isnull": False}) & ~Q(**{lookup: ""})
    return Q(**{f"{lookup}__isnull": False})


def compile_filter(text: str, fields: Mapping[str, FilterField]) -> Q:
    """Compile an AIP-160 ``filter`` over ``fields`` (API name -> FilterField) into a ``Q``.

    An empty or all-whitespace filter is ``Q()`` (everything). Raises
    :class:`xmc.listing.errors.FilterError` naming the field, value or
    position for anything invalid.
    """
    tree = parse_filter(text)
    if tree is None:
        return Q()
    return _Compiler(fields).node(tree)
