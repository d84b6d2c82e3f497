"""A short seeded run of the chaos suite (bench/chaos.py): the whole system, faults, invariants.

It runs as its own process (its own embedded Postgres and private Redis,
never the suite's; the work units launched by the real xmanager client, whose
virtualenv conftest.py has built), with a fixed seed so a failure can be replayed with
``./dev chaos --seed 7 --units 24 --faults 3 --spacing 8``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_short_seeded_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
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
