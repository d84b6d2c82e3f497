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
        assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2], \
            "the fixture's process outlived the run"
    finally:
        if run.poll() is None:
            run.kill()
        if started.exists():
            try:
                os.kill(int(started.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
