"""The code type-checks: mypy over every package (strict per package, see mypy.ini)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_type_checks() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "core", "delivery", "jobsets", "xmc", "experiments", "workunits", "artifacts", "metrics", "lifecycle", "studies", "k8s_bridge", "notifications", "usage", "ui", "simulators"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
