"""The production modules, parsed: what the architecture scans read (not tests, not migrations, not simulators)."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Every production package (the root packages of .importlinter but the simulators).
PACKAGES = ("core", "delivery", "jobsets", "xmc", "experiments", "workunits", "artifacts", "metrics", "lifecycle",
            "studies", "k8s_bridge", "notifications", "usage", "ui")


def parse(source: str, filename: str) -> ast.Module:
    """``ast.parse``, again when CPython 3.11's shared recursion counter was disturbed (gh-106905).

    On 3.11 two threads in ``ast.parse`` at once can fail one of them with "AST constructor recursion depth
    mismatch", and a traceback printed by any thread of the worker parses its lines (the carets under the
    failing expression): a thread left by an earlier test that logs an exception while a scan runs is enough
    (seen beside a second suite). The parse itself is deterministic, so the second answer is the answer.
    """
    for attempt in range(3):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error) or attempt == 2:
                raise
    raise AssertionError("not reached")


def modules(skip: frozenset[str] | set[str] = frozenset()) -> Iterator[tuple[str, ast.Module]]:
    """``(path from the root, its syntax tree)`` of every production module but ``skip``."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in rel and rel not in skip:
                yield rel, parse(path.read_text(), rel)
