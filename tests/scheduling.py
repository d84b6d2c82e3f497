"""A pytest plugin: how the suite is spread over pytest-xdist workers (docs/testing.md).

``./dev test`` runs ``-n 3 --dist loadgroup``: each test goes to whichever
worker is free, except tests that share an ``xdist_group``, which run on one
worker in a row. Two things are arranged here, after collection and before
xdist reads the groups:

* **A module that builds something once per module stays on one worker.**
  A test whose fixtures include a module- (or package- or class-) scoped one
  -- a whole system from ``run_all``, a simulator, a served cluster -- is put
  in its module's group, so that fixture is built once, not once per worker
  that happens to draw one of the module's tests. A test that names a group
  itself keeps it.
* **The longest work starts first.** Items are ordered so the modules in
  `RUN_FIRST` (the measured long ones: whole-system runs, mypy, the property
  tests) are handed out before the many short tests, which then fill the
  gaps; otherwise a three-minute test drawn last would be the run's tail.
  The order is the same in every worker (xdist checks that the collections
  agree) and does not change what any test sees.
"""
from __future__ import annotations

import pytest

#: Module paths (prefixes) handed out first, longest first: from the
#: ``--durations`` of full runs (docs/testing.md). Only the order depends on it.
RUN_FIRST = (
    "tests/system/test_run_folders.py",
    "tests/system/test_run_command.py",
    "tests/system/test_restart.py",
    "tests/system/chaos/",
    "tests/system/cli/test_logs.py",
    "tests/architecture/test_types.py",
    "tests/workunits/test_state_properties.py",
    "tests/k8s_bridge/actuator/test_crash_and_outage.py",
    "tests/system/cli/",
    "tests/system/e2e/",
    "tests/system/",
    "tests/workunits/scheduling/",
    "tests/notifications/test_worker.py",
    "tests/k8s_bridge/reconciler/test_leadership.py",
    "tests/security/test_input_fuzz.py",
    "tests/api/listing/test_filter_property.py",
    "tests/api/grpc_server/test_acl_matrix.py",
)

_SHARED_SCOPES = {"module", "package", "class"}


def _rank(path: str) -> int:
    for i, prefix in enumerate(RUN_FIRST):
        if path.startswith(prefix):
            return i
    return len(RUN_FIRST)


def _builds_per_module(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in _SHARED_SCOPES and _ours(defs[-1])
               for defs in info.name2fixturedefs.values())


def _ours(fixturedef: object) -> bool:
    """A fixture of the suite's own (pytest-django's class-scoped autouse set-up is not a build)."""
    return getattr(getattr(fixturedef, "func", None), "__module__", "").startswith("tests.")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group first: xdist's own hook turns the groups into the node ids it schedules by."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _builds_per_module(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


class _LongestFirst:
    """Order last, after pytest-django's sort by kind of database use (a stable sort keeps it
    within each rank)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        items.sort(key=lambda item: _rank(item.nodeid))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LongestFirst(), "xmc-longest-first")
