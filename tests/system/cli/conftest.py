"""Fixtures of the `xmc` command-line tests: the installed command, a live system, people with tokens.

`system` is the whole system as ``./dev run`` starts it (tests/system/e2e/conftest.py:
``scripts/run_all.py`` on free ports, the simulator behind it), one per test
module. `xmc` runs the installed console script of `cli_env` as a subprocess,
with a private HOME, ``COLUMNS=80`` and the given person's token.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.cli.cli_env import ROOT, ensure_cli_venv
from tests.system.cli.runner import ALICE, BOB, Run, Xmc  # noqa: F401 - re-exported for the tests
from tests.fixtures.systems import System


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build (or update) the xmc virtualenv right after collection, outside any test's timeout."""
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).is_relative_to(here) for item in items):
        ensure_cli_venv()


@pytest.fixture(scope="session")
def cli_venv() -> Path:
    return ensure_cli_venv()


def system_env(system: System) -> dict[str, str]:
    """The settings ``./dev run`` gave its processes (its run folder's ``env``), for manage.py calls."""
    env = dict(os.environ)
    for line in (system.run_dir / "env").read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


def issue_token(system: System, email: str, ttl: int | None = None) -> str:
    argv = [sys.executable, "manage.py", "issue_token", email, *(["--ttl", str(ttl)] if ttl else [])]
    done = subprocess.run(argv, cwd=ROOT, env=system_env(system), capture_output=True, text=True, timeout=60,
                          check=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def tokens(system: System) -> dict[str, str]:
    return {ALICE: issue_token(system, ALICE), BOB: issue_token(system, BOB)}


@pytest.fixture(scope="module")
def xmc(cli_venv: Path, system: System, tmp_path_factory: pytest.TempPathFactory) -> Xmc:
    home = tmp_path_factory.mktemp("home")
    return Xmc(cli_venv, home, system.api)


