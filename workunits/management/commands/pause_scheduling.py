"""``manage.py pause_scheduling --reason TEXT [--by NAME]``: pause scheduling cluster-wide.

Thin: calls ``workunits.scheduling.pause``, which waits for actuator tasks
already touching the cluster (at most ``XMC_PAUSE_DRAIN_TIMEOUT_S``). Pausing
a paused switch changes nothing and says so.
"""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ServiceError
from workunits import scheduling
from workunits.management.commands._scheduling import add_by_argument, describe, operator


class Command(BaseCommand):
    help = "Pause scheduling cluster-wide: Create, Restart and Update tasks are held until resume."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--reason", required=True, help="why (shown to users and in the history)")
        add_by_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        before = scheduling.get_status()
        try:
            status = scheduling.pause(reason=options["reason"], by=operator(options["by"]))
        except ServiceError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        if before.paused:
            self.stdout.write("scheduling was already paused; nothing changed")
        else:
            self.stdout.write(self.style.SUCCESS("scheduling paused"))
        for line in describe(status):
            self.stdout.write(line)
