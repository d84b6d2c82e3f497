"""`manage.py mlrun_emulator --port P`: serve the MachineLearningRun API emulator.

For the local system (``./dev run`` starts it and points
``XMC_MLRUN_ENDPOINT`` at it) and for manual testing; tests start
``k8s_bridge.sim.mlrun_emulator.run_emulator`` in-process. Stops cleanly on
SIGTERM/SIGINT. State lives in memory only.
"""
from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from k8s_bridge.sim.mlrun_emulator import run_emulator


class Command(BaseCommand):
    help = "Serve an emulator of the MachineLearningRun API (hypercomputecluster v1alpha)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=0, help="listen port (0 = pick a free one)")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--op-polls", type=int, default=1, help="polls before an operation is done")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            handle = run_emulator(port=options["port"], host=options["host"], op_polls=options["op_polls"])
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc}") from exc
        done = threading.Event()

        def on_signal(signum: int, frame: object) -> None:
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.stdout.write(f"mlrun_emulator: serving {handle.url}")
        self.stdout.flush()
        done.wait()
        handle.stop()
        self.stdout.write("mlrun_emulator: stopped")
