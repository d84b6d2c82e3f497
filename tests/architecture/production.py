"""The production modules, parsed: what the architecture scans read (not tests, not migrations, not simulators)."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Every production package (the root packages of .importlinter but the simulators).
PACKAGES = ("core", "delivery", "jobsets", "xmc", "experiments", "workunits", "artifacts", "metrics", "lifecycle",
            "studies", "k8s_bridge", "notifications", "usage", "ui")


def modules(skip: frozenset[str] | set[str] = frozenset()) -> Iterator[tuple[str, ast.Module]]:
    """``(path from the root, its syntax tree)`` of every production module but ``skip``."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in rel and rel not in skip:
                yield rel, ast.parse(path.read_text(), filename=rel)
