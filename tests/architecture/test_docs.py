"""Docs match the code: every relative link and every named code symbol exists.

Covers README.md, docs/testing.md and docs/architecture/*.md. A symbol is a backticked dotted
path that starts with one of our packages (``workunits.state.merge_execution``);
it must import, attribute by attribute.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "testing.md", ROOT / "docs" / "STYLE.md", *sorted((ROOT / "docs" / "architecture").glob("*.md"))]
PACKAGES = ("core", "delivery", "jobsets", "xmc", "experiments", "workunits", "artifacts", "metrics", "lifecycle", "studies", "k8s_bridge", "notifications", "usage", "ui", "simulators")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SYMBOL = re.compile(r"`((?:%s)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`" % "|".join(PACKAGES))


def resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_it_links_only_to_files_that_exist(doc: Path) -> None:
    missing = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert missing == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_it_links_only_inside_the_repository(doc: Path) -> None:
    """A reader of the project has the repository, nothing beside it: cite upstream by URL instead."""
    outside = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if path != ROOT and ROOT not in path.parents:
            outside.append(target)
    assert outside == []


OUTSIDE_PATH = re.compile(r"/work/shared|\.\./shared/|shared/(?:design|reference)/")


def test_it_names_no_file_outside_the_repository_in_docs_or_code() -> None:
    sources = [*DOCS, *(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")),
               *(ROOT / "tests").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in sources
                 if ".venv" not in p.parts and p != Path(__file__) and OUTSIDE_PATH.search(p.read_text())]
    assert offenders == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_it_names_only_code_symbols_that_exist(doc: Path) -> None:
    missing = []
    for dotted in sorted(set(SYMBOL.findall(doc.read_text()))):
        try:
            resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(dotted)
    assert missing == []


def test_it_documents_every_setting_in_the_readme() -> None:
    settings_src = (ROOT / "xmc" / "settings.py").read_text()
    names = set(re.findall(r'env\.\w+\("([A-Z0-9_]+)"', settings_src)) | set(
        re.findall(r'env\.\w+\(\s*"([A-Z0-9_]+)"', settings_src))
    readme = (ROOT / "README.md").read_text()
    assert names, "no settings found"
    assert sorted(n for n in names if f"`{n}`" not in readme) == []


def test_it_checks_the_checker() -> None:
    with pytest.raises(AttributeError):
        resolve("workunits.state.no_such_rule")
    assert resolve("workunits.state.merge_execution") is not None
