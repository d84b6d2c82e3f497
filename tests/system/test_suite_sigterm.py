"""SIGTERM to a test run tears its fixtures down, so the processes they started stop (tests/sigterm.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD_TEST = '''
import subprocess, time
from pathlib import Path

import pytest


@pytest.fixture
def server():
    proc = subprocess.Popen(["sleep", "600"])
    Path("started").write_text(str(proc.pid))
    yield proc
    proc.terminate()
    proc.wait()


def test_it_runs_long(server):
    time.sleep(120)
'''


def test_it_stops_what_a_terminated_test_run_s_fixtures_started(tmp_path: Path) -> None:
    from tests import conftest

    assert "tests.sigterm" in conftest.pytest_plugins  # the suite's own runs have it
    (tmp_path / "test_long.py").write_text(CHILD_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "-p", "tests.sigterm",
                            "-p", "no:cacheprovider", "test_long.py"], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = tmp_path / "started"
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.1)
        assert started.exists(), run.communicate()[0]
        child = int(started.read_text())
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=30)
        assert "KeyboardInterrupt: stopped by signal 15" in out, out
        assert not _the_fixtures_sleep(child), "the fixture's process outlived the run"
    finally:
        if run.poll() is None:
            run.kill()
        if started.exists() and _the_fixtures_sleep(int(started.read_text())):
            os.kill(int(started.read_text()), signal.SIGKILL)


def _the_fixtures_sleep(pid: int) -> bool:
    """Whether ``pid`` is still the fixture's running ``sleep 600``, not a zombie and not another process
    that has the pid since (a machine running two suites reuses pids within minutes)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return cmdline == b"sleep\x00600\x00" and state != "Z"
