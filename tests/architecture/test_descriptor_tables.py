"""docs/architecture/metrics.md carries the DashboardService facts as the descriptors give them.

The tables are generated (scripts/descriptor_tables.py) from the wheel's
descriptors; this only checks that the doc holds exactly what the generator
renders today, so no fact about the service is ever written by hand.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_holds_in_the_metrics_doc_the_tables_the_descriptors_give() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "descriptor_tables.py"), "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
