"""A short seeded run of the chaos suite (bench/chaos.py): the whole system, faults, invariants.

It runs as its own process (its own embedded Postgres and private Redis,
never the suite's; the work units launched by the real xmanager client, whose
virtualenv conftest.py has built), with a fixed seed so a failure can be replayed with
``./dev chaos --seed 7 --units 24 --faults 3 --spacing 8``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_it_keeps_every_invariant_in_a_short_seeded_chaos_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    done = subprocess.run(
        [sys.executable, "bench/chaos.py", "--seed", "7", "--units", "24", "--faults", "3", "--spacing", "8",
         "--settle", "180"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    print(done.stdout[-6000:], done.stderr[-4000:])
    assert "invariant" in done.stdout, "the run never reached its checks"
    assert done.returncode == 0, "an invariant failed (see the table above)"
    assert "FAIL" not in done.stdout


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process (from /proc)."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
        found[int(proc.name)] = (parent, cmdline)
    return found


def _started_by(root: int, marker: str) -> dict[int, str]:
    """The processes below ``root``, and the ones whose command line names ``marker`` (a daemonized Postgres)."""
    table = _processes()
    below, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, cmdline) in table.items():
            if ppid == parent and pid not in below:
                below[pid] = cmdline
                todo.append(pid)
    below.update({pid: cmdline for pid, (_, cmdline) in table.items() if marker in cmdline and pid != root})
    return below


def test_it_stops_the_chaos_run_and_everything_it_started_on_sigterm(machine_tmp: Path) -> None:
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    # Its data folder in a temporary folder of its own: a second suite's run of this story (the same seed)
    # makes an "xmc-chaos-4242-" folder too, whose processes and folder are not this run's to judge or remove.
    env["TMPDIR"] = str(machine_tmp)
    seed = 4242
    marker = str(machine_tmp / f"xmc-chaos-{seed}-")
    started: dict[int, str] = {}
    run = subprocess.Popen([sys.executable, "bench/chaos.py", "--seed", str(seed), "--units", "50", "--faults", "3",
                            "--spacing", "60"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            started = _started_by(run.pid, marker)
            if any("chaos_client.py" in c for c in started.values()):  # started last, once the system is up
                break
            time.sleep(0.5)
        kinds = ("simulators.cluster", "grpcserver", "celery -A xmc worker", "celery -A xmc beat", "reconcile",
                 "redis-server", "postgres", "chaos_client.py")
        assert all(any(k in c for c in started.values()) for k in kinds), sorted(started.values())
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=90)
        assert run.returncode == 128 + signal.SIGTERM, out[-3000:]
        left = {pid: c for pid, c in _processes().items() if pid in started and c[1] == started[pid]}
        assert not left, f"still running after the run stopped: {left}"
        assert not list(machine_tmp.glob(f"xmc-chaos-{seed}-*")), "its data folder was left behind"
    finally:  # a failed run leaves nothing to the tests after it
        if run.poll() is None:
            run.kill()
        for pid, cmdline in started.items():
            if _processes().get(pid, (0, ""))[1] == cmdline:
                os.kill(pid, signal.SIGKILL)
        for folder in machine_tmp.glob(f"xmc-chaos-{seed}-*"):
            shutil.rmtree(folder, ignore_errors=True)
