"""``manage.py resume_scheduling [--batch-size N] [--background] [--by NAME]``: resume scheduling.

Clears the switch and runs the resumption *inline* (``workunits.resumption.run``)
so the operator sees a progress bar over the held rows and a summary
(resumed, skipped by reason), and the exit status says whether it finished.
``--background`` instead hands the run to the ``resumption`` queue, as the
admin and the REST endpoint do. Safe to run while another run is going:
rows are locked with SKIP LOCKED, each is processed once.
"""
from __future__ import annotations

import sys
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ServiceError
from workunits import resumption, scheduling
from workunits.management.commands._scheduling import add_by_argument, operator


class ProgressBar:
    """A plain text bar on one line (``\\r``), one line per update when not a terminal."""

    def __init__(self, total: int, out: TextIO, width: int = 40) -> None:
        self.total, self.done, self.out, self.width = total, 0, out, width
        self.tty = out.isatty()

    def advance(self, n: int) -> None:
        self.done += n
        total = max(self.total, self.done)
        filled = int(self.width * self.done / total) if total else self.width
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{total} rows"
        self.out.write(("\r" + line) if self.tty else (line + "\n"))
        self.out.flush()

    def close(self) -> None:
        if self.tty and self.done:
            self.out.write("\n")


class Command(BaseCommand):
    help = "Resume scheduling: clear the switch and re-send the held tasks (progress bar, summary)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=scheduling.DEFAULT_BATCH_SIZE, metavar="N",
                            help=f"rows per transaction (default {scheduling.DEFAULT_BATCH_SIZE})")
        parser.add_argument("--background", action="store_true",
                            help="hand the run to the resumption queue instead of running it here")
        add_by_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        batch_size: int = options["batch_size"]
        try:
            result = scheduling.resume(by=operator(options["by"]), batch_size=batch_size,
                                       dispatch=options["background"])
        except ServiceError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write("scheduling resumed" if result.was_paused else "scheduling was not paused")
        self.stdout.write(f"resumption run: {result.run_id}")
        if options["background"]:
            self.stdout.write("the run was handed to the resumption queue")
            return
        bar = ProgressBar(scheduling.pending_paused_tasks(), getattr(self.stdout, "_out", sys.stdout))
        try:
            summary = resumption.run(result.run_id, batch_size=batch_size, progress=bar.advance)
        finally:
            bar.close()
        self.stdout.write(f"resumed: {summary.resumed}")
        self.stdout.write(f"skipped: {summary.skipped}")
        for reason, count in sorted(summary.skipped_by_reason.items()):
            self.stdout.write(f"  {reason}: {count}")
        if summary.interrupted:
            self.stdout.write(self.style.WARNING(
                "scheduling was paused again: the remaining rows wait for the next resume"))
