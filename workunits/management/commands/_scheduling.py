"""Shared bits of the scheduling commands: who is acting, and how a status reads."""
from __future__ import annotations

import getpass
import socket

from django.core.management.base import CommandParser

from workunits.scheduling import SchedulingStatus


def add_by_argument(parser: CommandParser) -> None:
    parser.add_argument("--by", default="", metavar="NAME",
                        help="who is acting, recorded in the switch history (default: OS user@host)")


def operator(by: str) -> str:
    if by.strip():
        return by.strip()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def describe(status: SchedulingStatus) -> list[str]:
    since = status.since.isoformat() if status.since else "never changed"
    lines = [f"scheduling: {'PAUSED' if status.paused else 'running'}"]
    if status.paused:
        lines += [f"paused since: {since}", f"paused by: {status.changed_by}", f"reason: {status.reason}"]
    else:
        lines += [f"running since: {since}"] + ([f"resumed by: {status.changed_by}"] if status.changed_by else [])
    lines.append(f"pending paused tasks: {status.pending_paused_tasks}")
    return lines
