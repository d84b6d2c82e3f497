"""Run every benchmark in bench/ (or the ones named): ./dev bench [name ...] [--option ...].

Options after the names go to every benchmark named, e.g.
``./dev bench update_executions --updates 20000``.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
BENCHES = ["update_executions", "api", "simcluster", "sim_controllers", "actuator", "reconciler", "resume", "notify_delivery",
           "metrics", "sweeps", "studies", "ui", "logs_follow", "usage_rollup", "queues", "system_metrics", "eta"]


def main(argv: list[str]) -> int:
    split = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    names, options = argv[:split], argv[split:]
    names = names or [b for b in BENCHES if (HERE / f"{b}.py").exists()]
    unknown = [n for n in names if not (HERE / f"{n}.py").exists()]
    if unknown:
        print(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(BENCHES)})", file=sys.stderr)
        return 2
    status = 0
    running: list[subprocess.Popen[bytes]] = []
    stopped: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        """SIGTERM / SIGHUP go to the benchmark that runs (it stops what it started); none runs after it."""
        stopped.append(signum)
        for child in running:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    for name in names:
        if stopped:
            return 128 + stopped[0]
        print(f"== bench/{name}.py", flush=True)
        child = subprocess.Popen([sys.executable, str(HERE / f"{name}.py"), *options], cwd=HERE.parent)
        running[:] = [child]
        status |= child.wait()
    return 128 + stopped[0] if stopped else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
