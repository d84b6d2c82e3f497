"""How a process hears it must stop: servers wait on an event, tooling unwinds into its clean-up once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from core.signals import stop_event

ROOT = Path(__file__).resolve().parents[2]


def test_it_gives_a_server_sigterm_as_its_stop_event_and_its_old_handler_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stopping: list[int] = []
    with stop_event(on_stop=stopping.append) as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stopped.wait(5)
    assert stopping == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before


def test_it_unwinds_a_tool_into_its_clean_up_once_however_many_signals_come() -> None:
    script = textwrap.dedent("""
        import os, signal, sys
        from core.signals import TERMINATION, raise_on

        class Stop(Exception):
            pass

        raise_on(TERMINATION, lambda signum: Stop(signum))
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            print("not reached")
        except Stop as why:
            os.kill(os.getpid(), signal.SIGHUP)  # a second signal during the clean-up is ignored
            os.kill(os.getpid(), signal.SIGTERM)
            print("cleaned up after", why)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cleaned up after {int(signal.SIGTERM)}"
