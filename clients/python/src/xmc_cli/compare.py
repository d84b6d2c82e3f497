"""``xmc compare XID``: a sweep's work units ranked by a metric, as a table, JSON or CSV.

One REST read does the work (``GET /v1/experiments/{xid}/workUnits:summarize``, the server's
`workUnits:summarize`: the filter, the order and the pages run in its database); this module picks
the metric and its direction, and prints. ``xmc status`` uses `metric_columns` and `lower_is_better`
for its metric columns.
"""
from __future__ import annotations

import argparse
import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from xmc_cli import render
from xmc_cli.errors import EXIT_OK, CliError
from xmc_cli.targets import parse

#: Metric names that are better when lower (the pages use the same rule).
LOWER_IS_BETTER = ("loss", "error", "err", "perplexity", "mse", "mae", "rmse")


def lower_is_better(metric: str) -> bool:
    name = metric.lower()
    return any(word in name for word in LOWER_IS_BETTER)


def metric_arg(text: str) -> tuple[str, str | None]:
    """``loss``, ``loss:min`` or ``acc:max`` -> (metric, "min" | "max" | None: by its name)."""
    name, sep, goal = text.rpartition(":")
    if not sep or goal not in ("min", "max"):
        name, goal = text, ""
    if not name.strip():
        raise argparse.ArgumentTypeError(f"bad --metric {text!r}: a metric name, then optionally :min or :max")
    return name.strip(), goal or None


#: The metrics XMC records itself from the cluster (GPU, CPU, memory): shown by ``xmc status --system``
#: and ranked by only when asked (``--metric system/gpu_utilization``), never in the default columns.
SYSTEM_PREFIX = "system/"


def metric_columns(names: Sequence[str], limit: int = 3) -> list[str]:
    """Up to ``limit`` of the job's own metrics to show: the loss-like ones first, then the others, by name."""
    own = [n for n in names if not n.startswith(SYSTEM_PREFIX)]
    return sorted(own, key=lambda n: (not lower_is_better(n), n))[:limit]


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _value(row: Mapping[str, Any], metric: str, stat: str = "last") -> Any:
    return ((row.get("metrics") or {}).get(metric) or {}).get(stat)


def cmd_compare(ctx: Any, args: argparse.Namespace) -> int:
    target = parse(args.target)
    if target.wids:
        raise CliError("compare takes an experiment (XID), and --filter to narrow its work units")
    xid = target.xid
    envelope, _ = ctx.api.summarize(xid, limit=1)
    names: list[str] = list(envelope.get("metrics") or [])
    if args.metric:
        metric, goal = args.metric
        if metric not in names:
            raise CliError(f"experiment {xid} has no metric {metric!r}" +
                           (f" (its metrics: {', '.join(names)})" if names else " (it has no metrics yet)"))
    else:
        if not metric_columns(names, 1):
            raise CliError(f"experiment {xid} has no metrics yet: nothing to rank by" +
                           (" (only system metrics: rank by one with --metric)" if names else ""))
        metric, goal = metric_columns(names, 1)[0], None
    goal = goal or ("min" if lower_is_better(metric) else "max")
    others = [n for n in metric_columns(names, 4) if n != metric][:3]
    shown = [metric, *others]
    order = f"metrics.{metric}.last {'asc' if goal == 'min' else 'desc'}"
    filter_text = f"metrics.{metric}.last:*" + (f" AND ({args.filter})" if args.filter else "")
    head, rows = ctx.api.summarize(xid, metrics=shown, filter=filter_text, order_by=order, limit=args.top)
    varying = list(head.get("varyingArgs") or [])
    ranked = [{"rank": i + 1, **row} for i, row in enumerate(rows)]
    if args.json:
        ctx.json({"xid": xid, "metric": metric, "goal": goal, "matching": head.get("totalSize", len(rows)),
                  "argsInCommon": head.get("argsInCommon") or {}, "workUnits": ranked})
        return EXIT_OK
    if args.csv:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        stats = ("last", "min", "max", "lastStep", "count")
        writer.writerow(["rank", "wid", "job", "state", *(f"args.{a}" for a in varying),
                         *(f"{m}.{s}" for m in shown for s in stats)])
        for row in ranked:
            writer.writerow([row["rank"], row.get("workUnitId"), row.get("jobName", ""), row.get("state", ""),
                             *((row.get("args") or {}).get(a, "") for a in varying),
                             *(fmt(_value(row, m, s)) for m in shown for s in stats)])
        ctx.out.file.write(out.getvalue())
        ctx.out.file.flush()
        return EXIT_OK
    if not rows:
        ctx.err.print(f"No work unit of experiment {xid} has {metric}" + (" and matches the filter." if args.filter else "."))
        return EXIT_OK
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for title, justify in (("#", "right"), ("WID", "right"), ("JOB", "left"), ("STATE", "left")):
        table.add_column(title, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for name in varying[:4]:
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=14)
    table.add_column(f"{metric} {'↓' if goal == 'min' else '↑'}", justify="right", no_wrap=True, style="bold")
    for name in others:
        table.add_column(name, justify="right", no_wrap=True, overflow="ellipsis", max_width=14)
    for row in ranked:
        cells: list[Any] = [str(row["rank"]), str(row.get("workUnitId", "")), row.get("jobName", ""),
                            render.state(str(row.get("state", "")))]
        cells += [(row.get("args") or {}).get(a, "") for a in varying[:4]]
        cells.append(fmt(_value(row, metric)))
        cells += [fmt(_value(row, m)) for m in others]
        table.add_row(*cells)
    ctx.out.print(render.fit(table, ctx.out))
    common = head.get("argsInCommon") or {}
    footer = f"{len(rows)} of {head.get('totalSize', len(rows))} work units with {metric}, best first"
    if common:
        footer += " · shared: " + " ".join(f"{k}={v}" for k, v in common.items())
    ctx.out.print(Text(footer, style="dim"))
    return EXIT_OK
