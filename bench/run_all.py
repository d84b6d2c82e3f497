"""Run every benchmark in bench/ (or the ones named): ./dev bench [name ...]."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = ["update_executions", "api", "simcluster", "sim_controllers", "actuator", "reconciler", "resume"]


def main(argv: list[str]) -> int:
    names = argv or [b for b in BENCHES if (HERE / f"{b}.py").exists()]
    status = 0
    for name in names:
        print(f"== bench/{name}.py", flush=True)
        status |= subprocess.call([sys.executable, str(HERE / f"{name}.py")], cwd=HERE)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
