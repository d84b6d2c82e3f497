"""The README's run command starts every process and each one answers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_it_starts_every_process_and_stops_them() -> None:
    env = {**os.environ, "XMC_WEB_PORT": "18000", "XMC_SIM_PORT": "16443", "XMC_GRPC_PORT": "15051"}
    result = subprocess.run([sys.executable, "scripts/run_all.py", "--smoke"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("web", "simulator", "grpc", "mlrun"):
        assert f"run: {name}" in result.stdout
