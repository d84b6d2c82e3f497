"""The chaos run launches its work units with the real client: build its virtualenv before the run's clock starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.real_client.client_env import ensure_client_venv


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """As in tests/system/real_client/conftest.py: a first build (minutes) must not count against the test's timeout."""
    here = Path(__file__).parent
    if not any(Path(str(item.fspath)).is_relative_to(here) for item in items):
        return
    reporter = config.pluginmanager.getplugin("terminalreporter")
    ensure_client_venv(reporter.write_line if reporter is not None else print)
