"""The image installs only requirements.txt: everything the running code imports must come from it.

Test tools live in requirements-dev.txt (which ./dev installs on top), so a
production module importing one of them would work in the test suite and
fail in the image. This reads the imports of every runtime package and
checks each third-party one against the distributions requirements.txt (and
the xmanager wheel, installed without dependencies) brings in.
"""
from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
RUNTIME_PACKAGES = ("artifacts", "core", "delivery", "experiments", "jobsets", "k8s_bridge", "lifecycle", "metrics",
                    "notifications", "studies", "ui", "usage", "workunits", "xmc")


def pinned(path: Path) -> list[Requirement]:
    """The requirements of a pip requirements file, following ``-r`` includes."""
    found: list[Requirement] = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r"):
            found += pinned(path.parent / line[2:].strip())
        elif line:
            found.append(Requirement(line))
    return found


def installed_closure(roots: list[Requirement]) -> set[str]:
    """Canonical names of ``roots`` and everything they require (with the extras asked for)."""
    seen: set[str] = set()
    todo = [(r.name, frozenset(r.extras)) for r in roots]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in seen and not extras:
            continue
        seen.add(key)
        for spec in metadata.requires(name) or []:
            req = Requirement(spec)
            if req.marker is not None and not any(
                req.marker.evaluate({**default_environment(), "extra": extra}) for extra in (extras or {""})
            ):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return seen


def third_party_imports() -> dict[str, str]:
    """Top-level module -> a file importing it, over the runtime packages and manage.py."""
    first_party = set(RUNTIME_PACKAGES) | {"tests", "bench", "manage"}
    files = [ROOT / "manage.py", *(p for pkg in RUNTIME_PACKAGES for p in (ROOT / pkg).rglob("*.py"))]
    found: dict[str, str] = {}
    for path in files:
        if "_pb2" in path.name:
            continue  # generated from our protos
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in first_party:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_it_sees_the_runtime_code_import_only_what_the_image_installs() -> None:
    runtime = installed_closure(pinned(ROOT / "requirements.txt"))
    runtime |= {canonicalize_name(r.name) for r in pinned(ROOT / "requirements-xmanager.txt")}
    providers = metadata.packages_distributions()
    missing = {
        module: where for module, where in third_party_imports().items()
        if not {canonicalize_name(d) for d in providers.get(module, [])} & runtime
    }
    assert missing == {}, f"imported by runtime code but not installed by requirements.txt: {missing}"


def test_it_sees_a_dev_only_import() -> None:
    # The check can fail: pytest is installed here, but only by requirements-dev.txt.
    runtime = installed_closure(pinned(ROOT / "requirements.txt"))
    assert "pytest" not in runtime and "mypy" not in runtime
    assert "pytest" in installed_closure(pinned(ROOT / "requirements-dev.txt"))
    assert re.search(r"^-r requirements\.txt$", (ROOT / "requirements-dev.txt").read_text(), re.M)
