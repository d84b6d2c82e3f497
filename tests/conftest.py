"""Shared fixtures: every test that touches the database runs on real Postgres."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

#: One plugin per concept, for every folder: people (tests/fixtures/people.py), simulators
#: (tests/fixtures/simulators.py), the whole system (tests/fixtures/systems.py) and Celery workers;
#: SIGTERM as Ctrl-C (tests/sigterm.py): fixtures tear down and stop their processes; and how the
#: suite is spread over xdist workers (tests/scheduling.py).
pytest_plugins = ["tests.fixtures.people", "tests.fixtures.simulators", "tests.fixtures.systems",
                  "tests.fixtures.browsers", "tests.sigterm", "tests.scheduling", "tests.celery_workers"]

# Servers (and the processes tests start) refuse the public default secret
# (xmc.checks): the suite signs with a proper test-only key, set before the
# settings are read and inherited by every child process.
os.environ.setdefault("XMC_SECRET_KEY", "xmc-test-suite-secret-key-0123456789abcdefghijklmnopqrstuvwxyz")
# Reconcilers started by tests archive pod logs into a throw-away folder, not .run/; the process
# that made it (the run, or each xdist worker) removes it when it exits.
if "XMC_LOG_ARCHIVE_URL" not in os.environ:
    _archive = tempfile.mkdtemp(prefix="xmc-test-log-archive-")
    atexit.register(shutil.rmtree, _archive, ignore_errors=True)
    os.environ["XMC_LOG_ARCHIVE_URL"] = f"file://{_archive}"
# Property tests judge what the code does, not how fast the machine is: a loaded
# machine (parallel workers, a second suite) must not fail them by the clock.
hypothesis_settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("suite")


@pytest.fixture(scope="session", autouse=True)
def _fresh_redis() -> None:
    """The run's test databases are new, and so is its Redis database: an earlier run's live replay
    logs, rate-limit buckets and throttles name rows that no longer exist, under ids that start
    again from 1 (a stream of experiment 25 replayed the last run's experiment 25)."""
    import redis
    from django.conf import settings

    for url in {u for u in (settings.REDIS_URL, settings.CELERY_BROKER_URL) if u.startswith("redis://")}:
        client = redis.Redis.from_url(url)
        try:
            client.flushdb()
        except redis.ConnectionError:
            pass  # the tests that need Redis say so themselves
        finally:
            client.close()


@pytest.fixture(autouse=True)
def _no_outbox_delivery(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Record what the outbox would hand to the actuator instead of sending it."""
    delivered: list[list[int]] = []
    # Both ways in: the request path (the rows it wrote) and the sweep's (ids).
    monkeypatch.setattr("workunits.outbox.deliver_committed",
                        lambda ops, notify_when=None: delivered.append([op.id for op in ops]))
    monkeypatch.setattr("workunits.outbox.deliver", lambda ids: delivered.append(list(ids)))
    return delivered


@pytest.fixture(autouse=True)
def _fresh_identity_cache() -> None:
    """Each test starts with an empty identity cache (a rolled-back user fires no signal)."""
    from xmc.auth.identity import clear_identity_cache

    clear_identity_cache()


@pytest.fixture
def delivered(_no_outbox_delivery: list[list[int]]) -> list[list[int]]:
    """Operation ids handed to the outbox (run on-commit work with
    ``django_capture_on_commit_callbacks(execute=True)`` around the call)."""
    return _no_outbox_delivery
