"""The input fuzz's long randomised run (issue 40, item 8): new inputs every run, many per endpoint.

    ./dev bench fuzz [--scale 10] [--runs 3] [--workers 2]
    (or: python bench/fuzz.py ...)

Not a benchmark, and not in ``./dev bench``'s default list: a marked command
for the fuzz of every REST route and gRPC method
(``tests/security/test_input_fuzz.py``). In the suite that fuzz draws a fixed,
small set of examples (hypothesis derandomized), so it is fast and a failure
replays; here it runs ``--runs`` times with ``XMC_FUZZ_RANDOM=1`` (fresh
random draws each run) and ``XMC_FUZZ_SCALE=--scale`` (that many times the
examples per endpoint). Each run prints its time and outcome, and the inputs
that answered 500 or INTERNAL, one per endpoint. A request found here gets
a test of its own (the request played as it was found) beside its fix, so
the suite plays it for ever after.

Exit status: 0 when every run passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from _signals import exit_on_termination

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/security/test_input_fuzz.py"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=10, help="examples per endpoint, times the suite's")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (-n)")
    args = parser.parse_args(argv)
    exit_on_termination()
    env = {**os.environ, "XMC_FUZZ_RANDOM": "1", "XMC_FUZZ_SCALE": str(args.scale)}
    failed = 0
    for run in range(1, args.runs + 1):
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", TEST, "-n", str(args.workers), "-q",
             "-k", "never_answers", "--timeout=3600"],
            cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - started
        summary = next((line for line in reversed(result.stdout.splitlines()) if " in " in line), "")
        print(f"run {run}/{args.runs}: {'passed' if result.returncode == 0 else 'FAILED'} in {seconds:.0f} s "
              f"(scale {args.scale}) {summary.strip('= ')}", flush=True)
        if result.returncode != 0:
            failed += 1
            for found in re.findall(r"^E\s+(?:AssertionError: )?(\(.*)$", result.stdout, flags=re.MULTILINE)[:40]:
                print("   ", found[:600], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
