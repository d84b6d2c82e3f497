"""``xmc usage`` and ``xmc queues``: who used the cluster, and what waits in its queues.

``usage`` reads ``GET /v1/usage`` (GPU- and CPU-hours of running executions,
rolled up by owner, experiment or queue over a period; staff see everyone's,
anyone else their own); ``queues`` reads ``GET /v1/queues`` and each
ClusterQueue's first pending workloads (``GET /v1/queues/{cq}/pendingWorkloads``).
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

from rich.table import Table
from rich.text import Text

from xmc_cli import safe
from xmc_cli.errors import EXIT_OK, CliError

_SPAN = re.compile(r"^(\d{1,6})([hdw])$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def span_arg(text: str) -> timedelta:
    match = _SPAN.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"bad --since {text!r}: a number and h, d or w (e.g. 7d)")
    n, unit = int(match.group(1)), match.group(2)
    return timedelta(hours=n) if unit == "h" else timedelta(days=n * (7 if unit == "w" else 1))


def time_arg(text: str) -> str:
    value = text.strip()
    if not _RFC3339.match(value):
        raise argparse.ArgumentTypeError(f"bad time {text!r}: RFC 3339, e.g. 2026-01-31T00:00:00Z")
    return value


def _rfc3339(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hours(value: Any) -> str:
    return f"{float(value or 0):,.1f}"


def cmd_usage(ctx: Any, args: argparse.Namespace) -> int:
    end = args.end or _rfc3339(datetime.now(timezone.utc))
    start = args.start or _rfc3339(datetime.fromisoformat(end.replace("Z", "+00:00")) - args.since)
    params = {"groupBy": args.by, "startTime": start, "endTime": end, "pageSize": args.limit}
    body = ctx.api.request("GET", "/v1/usage", what="usage", params=params)
    if args.json:
        ctx.json(body)
        return EXIT_OK
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False, expand=False)
    table.add_column(args.by.upper(), overflow="ellipsis", no_wrap=True, ratio=3, min_width=8)
    for name in ("GPU-H", "USED", "CPU-H", "EXECS"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in body.get("rows") or []:
        gpu, used = float(row.get("gpuHours") or 0), float(row.get("gpuHoursUsed") or 0)
        pct = f" {round(100 * used / gpu)}%" if gpu else ""
        table.add_row(safe.plain(row.get("key") or "(default)"), _hours(gpu), _hours(used) + pct,
                      _hours(row.get("cpuHours")), str(row.get("executions") or 0))
    total = body.get("total") or {}
    ctx.out.print(Text(f"usage {body.get('startTime')} to {body.get('endTime')}", style="dim"))
    if not body.get("rows"):
        ctx.out.print(Text("nothing ran in this period", style="dim"))
        return EXIT_OK
    table.add_row(Text("total", style="bold"), _hours(total.get("gpuHours")), _hours(total.get("gpuHoursUsed")),
                  _hours(total.get("cpuHours")), str(total.get("executions") or 0))
    ctx.out.print(table)
    if body.get("nextPageToken"):
        ctx.out.print(Text(f"(the {args.limit} largest of {body.get('totalSize')}; --limit shows more)", style="dim"))
    return EXIT_OK


def _estimate(value: Any) -> str:
    if not isinstance(value, dict):
        return "unknown"
    low, high = int(value.get("minSeconds") or 0), int(value.get("maxSeconds") or 0)

    def span(s: int) -> str:
        return f"{s}s" if s < 90 else f"{round(s / 60)}m" if s < 5400 else f"{s / 3600:.1f}h"
    return f"within {span(high)}" if low < 1 else f"{span(low)}-{span(high)}"


def cmd_queues(ctx: Any, args: argparse.Namespace) -> int:
    queues = ctx.api.request("GET", "/v1/queues", what="queues").get("clusterQueues") or []
    if args.queue:
        queues = [q for q in queues if q.get("name") == args.queue]
        if not queues:
            raise CliError(f"ClusterQueue {args.queue} not found")
    for q in queues:
        q["pending"] = []
        if q.get("pendingWorkloads") and args.pending:
            body = ctx.api.request("GET", f"/v1/queues/{quote(str(q['name']), safe='')}/pendingWorkloads",
                                   what=f"ClusterQueue {q['name']}", params={"pageSize": args.pending})
            q["pending"] = body.get("pendingWorkloads") or []
    if args.json:
        ctx.json({"clusterQueues": queues})
        return EXIT_OK
    for n, q in enumerate(queues):
        if n:
            ctx.out.print()
        head = Text(safe.clean(q.get("name")), style="bold")
        head.append(f"  {q.get('admittedWorkloads', 0)} admitted, {q.get('pendingWorkloads', 0)} pending")
        if q.get("cohort"):
            head.append(f"  cohort {safe.clean(q['cohort'])}", style="dim")
        ctx.out.print(head)
        quota = Table(box=None, pad_edge=False, header_style="bold", show_edge=False, expand=False)
        for name, justify in (("FLAVOR", "left"), ("RESOURCE", "left"), ("QUOTA", "right"), ("IN USE", "right"),
                              ("BORROWED", "right")):
            quota.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for r in q.get("resources") or []:
            quota.add_row(*(safe.plain(r.get(k) or "") for k in ("flavor", "resource", "nominalQuota", "usage",
                                                                 "borrowed")))
        ctx.out.print(quota)
        if q["pending"]:
            waiting = Table(box=None, pad_edge=False, header_style="bold", show_edge=False, expand=False)
            for name in ("#", "WORK UNIT", "OWNER", "LOCALQUEUE", "START"):
                waiting.add_column(name, no_wrap=True, overflow="ellipsis")
            for p in q["pending"]:
                unit = p.get("workUnit") or ""
                where = unit.replace("experiments/", "").replace("/workUnits/", "/") if unit else p.get("name")
                waiting.add_row(str(int(p.get("positionInClusterQueue") or 0) + 1), safe.plain(where),
                                safe.plain(p.get("owner") or "-"), safe.plain(p.get("localQueue") or ""),
                                _estimate(p.get("estimatedStart")))
            ctx.out.print(waiting)
    return EXIT_OK


def add_commands(command: Callable[[str, str], argparse.ArgumentParser], positive: Callable[[str], int]) -> None:
    p = command("usage", "GPU- and CPU-hours of running executions by owner, experiment or queue "
                         "(yours; staff: everyone's)")
    p.add_argument("--by", choices=("owner", "experiment", "queue"), default="owner", help="group by (default owner)")
    p.add_argument("--since", type=span_arg, default=timedelta(days=7), metavar="SPAN",
                   help="the period before --end: 24h, 7d, 4w (default 7d)")
    p.add_argument("--start", type=time_arg, metavar="TIME", help="RFC 3339 start (instead of --since)")
    p.add_argument("--end", type=time_arg, metavar="TIME", help="RFC 3339 end (default now)")
    p.add_argument("--limit", type=positive, default=20, help="the N largest rows (default 20)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_usage)

    p = command("queues", "the cluster's Kueue queues: quota, usage, borrowing and the work waiting")
    p.add_argument("queue", nargs="?", metavar="CLUSTERQUEUE", help="only this ClusterQueue")
    p.add_argument("--pending", type=int, default=10, metavar="N",
                   help="show each queue's first N pending workloads (default 10; 0: none)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_queues)
