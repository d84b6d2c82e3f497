"""``manage.py scheduling_status``: paused or not, since when, by whom, pending paused tasks."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from workunits import scheduling
from workunits.management.commands._scheduling import describe


class Command(BaseCommand):
    help = "Show whether scheduling is paused, since when, by whom, and how many tasks wait."

    def handle(self, *args: Any, **options: Any) -> None:
        for line in describe(scheduling.get_status()):
            self.stdout.write(line)
