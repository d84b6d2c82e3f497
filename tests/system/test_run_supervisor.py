"""``./dev run`` keeps the system up: a process that dies is restarted with back-off; only a crash loop stops it.

``scripts/run_all.py``'s ``Restarts`` (the pure rule) and ``supervise`` (the
loop) on real child processes: small Python programs that die on cue.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.system.conftest import load_run_all


@pytest.fixture
def run_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``scripts/run_all.py`` as a module, its run folder the test's own."""
    return load_run_all(tmp_path, monkeypatch)


def test_it_backs_off_doubling_and_forgets_old_deaths(run_all: ModuleType) -> None:
    r = run_all.Restarts(limit=5, window_s=60, base_s=1, max_delay_s=5)
    assert [r.died(t) for t in (0, 1, 2, 3)] == [1, 2, 4, 5]
    assert r.died(100) == 1  # the earlier deaths are out of the window: a fresh start


def test_it_calls_more_deaths_than_the_limit_within_the_window_a_crash_loop(run_all: ModuleType) -> None:
    r = run_all.Restarts(limit=2, window_s=60, base_s=1, max_delay_s=5)
    assert r.died(0) == 1 and r.died(10) == 2
    assert r.died(20) is None


def test_it_restarts_a_process_that_died_and_keeps_the_others(run_all: ModuleType, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "died-once"
    # Dies the first time, runs the second time.
    flaky = run_all.Process("worker", [sys.executable, "-c",
                                       f"import pathlib,sys,time\np=pathlib.Path({str(marker)!r})\n"
                                       "if not p.exists():\n    p.touch(); sys.exit(3)\ntime.sleep(60)"])
    steady = run_all.Process("web", [sys.executable, "-c", "import time; time.sleep(60)"])
    flaky.restarts = run_all.Restarts(limit=3, window_s=60, base_s=2, max_delay_s=2)
    procs = [flaky, steady]
    for proc in procs:
        run_all.start(proc, {})
    steady_pid = steady.popen.pid
    stop = threading.Event()

    def loop() -> None:
        original = run_all.time.sleep

        def sleep(seconds: float) -> None:
            if stop.is_set():
                raise SystemExit
            original(seconds)
        run_all.time.sleep = sleep
        try:
            run_all.supervise(procs, {}, tick_s=0.05)
        except SystemExit:
            pass
        finally:
            run_all.time.sleep = original

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        # While it waits for its restart the run folder says it is down (the pages' banner reads it).
        down = tmp_path / run_all.DOWN_FILE
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "worker" not in (down.read_text() if down.exists() else ""):
            time.sleep(0.05)
        assert list(json.loads(down.read_text())) == ["worker"]
        # The restart's line goes to the console first, then to the process's log: wait for the log's.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "worker restarted" not in (tmp_path / "worker.log").read_text():
            time.sleep(0.1)
        log = (tmp_path / "worker.log").read_text()
        assert "worker exited with code 3; restarting it in 2 s" in log
        assert json.loads(down.read_text()) == {}
        assert "worker restarted" in log
        assert "run: worker restarted" in capsys.readouterr().out
        assert flaky.popen.poll() is None and steady.popen.pid == steady_pid and steady.popen.poll() is None
    finally:
        stop.set()
        thread.join(10)
        run_all.stop_all(procs)


def test_it_stops_on_a_crash_loop_naming_the_process_and_its_log(run_all: ModuleType, tmp_path: Path) -> None:
    broken = run_all.Process("beat", [sys.executable, "-c", "import sys; sys.exit(1)"])
    broken.restarts = run_all.Restarts(limit=2, window_s=60, base_s=0.05, max_delay_s=0.1)
    run_all.start(broken, {})
    with pytest.raises(run_all.CrashLoop) as loop:
        run_all.supervise([broken], {}, tick_s=0.02)
    assert str(loop.value) == (f"beat keeps dying (3 times in 60 s, last exit code 1); its log: {tmp_path}/beat.log")


def test_it_stops_the_reconciler_while_the_simulator_still_answers_when_stopped(run_all: ModuleType, tmp_path: Path) -> None:
    """The reconciler's last act is to give up its lease, which lives in the simulator: the simulator goes last."""
    verdict = tmp_path / "verdict"
    simulator = run_all.Process("simulator", [sys.executable, "-c", "import time; time.sleep(120)"])
    run_all.start(simulator, {})
    assert simulator.popen is not None
    # On SIGTERM it looks at the simulator's process: still running (not a zombie), or gone.
    reconciler = run_all.Process("reconciler", [sys.executable, "-c", (
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    time.sleep(0.5)  # the reconciler flushes its batcher and stops its watches first\n"
        "    try:\n"
        f"        state = open('/proc/{simulator.popen.pid}/status').read().split('State:')[1].split()[0]\n"
        "    except FileNotFoundError:  # gone and reaped\n"
        "        state = 'X'\n"
        f"    open({str(verdict)!r}, 'w').write('alive' if state in ('S', 'R') else 'gone')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"open({str(verdict)!r} + '.ready', 'w').write('1')\n"
        "time.sleep(120)\n")])
    run_all.start(reconciler, {})
    deadline = time.monotonic() + 20
    while not Path(f"{verdict}.ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    run_all.stop_all([simulator, reconciler])
    assert verdict.read_text() == "alive"
    assert simulator.popen.poll() is not None and reconciler.popen.poll() is not None
