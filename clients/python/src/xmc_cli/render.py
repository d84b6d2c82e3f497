"""Rich tables for the terminal (80 columns and up) and the JSON shapes of ``--json``."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from xmc_cli import present, safe


def fit(table: Table, console: Console) -> Table:
    """Spread the table over the terminal only when it does not fit in its natural width.

    Rich shrinks ratio columns (titles, owners, messages) with an ellipsis only
    in an expanded table; a table that fits keeps its natural width.
    """
    table.expand = console.measure(table).maximum >= console.width  # the measurement is capped at the width
    return table


def rollup(counts: Mapping[str, int]) -> Text:
    text = Text(no_wrap=True)
    for i, (part, style, _) in enumerate(present.rollup_parts(counts)):
        if i:
            text.append(" ")
        text.append(part, style=style)
    return text if text.plain else Text("—", style="dim")


def state(value: str) -> Text:
    return Text(f"{present.GLYPH.get(value, '?')} {safe.clean(value).replace('_', ' ').lower()}", style=present.style_of(value),
                no_wrap=True)


def experiments_table(experiments: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False, expand=False)
    table.add_column("XID", justify="right", no_wrap=True)
    table.add_column("TITLE", overflow="ellipsis", no_wrap=True, ratio=3, min_width=8)
    table.add_column("OWNER", overflow="ellipsis", no_wrap=True, ratio=2, min_width=6)
    table.add_column("UNITS", no_wrap=True)
    table.add_column("W/E", justify="right", no_wrap=True)
    table.add_column("CREATED", no_wrap=True)
    table.add_column("TIME", justify="right", no_wrap=True)
    for e in experiments:
        severities = present.severity_counts(e)
        warnings = severities.get("WARNING", 0)
        errors = severities.get("ERROR", 0) + severities.get("FATAL", 0)
        we = Text(no_wrap=True)
        if warnings or errors:
            we.append(str(warnings), style="yellow" if warnings else "dim")
            we.append("/")
            we.append(str(errors), style="red" if errors else "dim")
        table.add_row(
            str(present.xid_of(e.get("name", ""))),
            safe.plain(e["title"]) if e.get("title") else Text("(untitled)", style="dim"),
            safe.plain(e.get("creator") or ""), rollup(present.state_counts(e)), we, present.created(e.get("createTime")),
            present.duration(e.get("createTime"), e.get("completeTime")),
        )
    return table


def pack(parts: Sequence[str], width: int, sep: str = " · ") -> str:
    """``parts`` joined by ``sep``, broken into lines between parts (never inside one) to fit ``width``."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return "\n".join(lines)


def experiment_header(e: Mapping[str, Any], units: Sequence[Mapping[str, Any]], *, width: int = 80) -> Text:
    status = e.get("status") or {}
    xid = present.xid_of(e.get("name", ""))
    head = Text()
    head.append(f"Experiment {xid}", style="bold")
    if e.get("title"):
        head.append(f"  {safe.clean(e['title'])}")
    head.append("\n")
    active = str(status.get("activeState") or "").replace("ACTIVE_STATE_UNSPECIFIED", "")
    launch = str(status.get("launchState") or "").replace("LAUNCH_STATE_UNSPECIFIED", "")
    facts = [f"owner {safe.clean(e.get('creator') or '?')}"]
    if active:
        facts.append(active.lower())
    if launch:
        facts.append(f"launch {launch.lower()}")
    facts.append(f"created {present.created(e.get('createTime'))}")
    took = present.duration(e.get("createTime"), e.get("completeTime"))
    if took:
        facts.append(f"{'took' if e.get('completeTime') else 'for'} {took}")
    head.append(pack(facts, width), style="dim")  # each fact whole: no break inside "took 5m53s"
    head.append("\nUnits ")
    counts: dict[str, int] = {}
    for unit in units:
        counts[present.state_of(unit)] = counts.get(present.state_of(unit), 0) + 1
    head.append_text(rollup(counts if units else present.state_counts(e)))
    shared = shared_args(units)
    if shared:
        head.append("\nShared args ", style="dim")
        head.append(safe.clean(present.one_line(" ".join(f"{k}={v}" for k, v in shared.items()), 200)), style="dim")
    return head


def shared_args(units: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    all_args = [present.args_of(u) for u in units]
    if not all_args:
        return {}
    varying = set(present.differing(all_args))
    return {k: v for k, v in all_args[0].items() if k not in varying and all(a.get(k) == v for a in all_args)}


def _last(row: Mapping[str, Any] | None, metric: str) -> str:
    value = (((row or {}).get("metrics") or {}).get(metric) or {}).get("last")
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def units_table(units: Sequence[Mapping[str, Any]], *, max_arg_columns: int = 4,
                sweep: Mapping[int, Mapping[str, Any]] | None = None, metrics: Sequence[str] = ()) -> Table:
    """The work units, one row each; with ``sweep`` (the sweep read's rows by wid) also their job name and
    the last value of ``metrics``."""
    all_args = [present.args_of(u) for u in units]
    columns = present.differing(all_args)
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    table.add_column("WID", justify="right", no_wrap=True)
    if sweep is not None:
        table.add_column("JOB", no_wrap=True, overflow="ellipsis", max_width=14)
    table.add_column("STATE", no_wrap=True)
    table.add_column("EX", justify="right", no_wrap=True)
    shown = columns[:max_arg_columns]
    for name in shown:
        table.add_column(safe.plain(name), no_wrap=True, overflow="ellipsis", max_width=14)  # as written: arguments, not ours
    if len(columns) > len(shown):
        table.add_column(Text(f"+{len(columns) - len(shown)} args"), no_wrap=True, overflow="ellipsis", max_width=10)
    for metric in metrics:
        table.add_column(safe.plain(metric), justify="right", no_wrap=True, overflow="ellipsis", max_width=12)
    table.add_column("MESSAGE", no_wrap=True, overflow="ellipsis", ratio=1, min_width=10)
    table.add_column("TIME", justify="right", no_wrap=True)
    for unit, args in zip(units, all_args):
        execution = unit.get("currentWorkUnitExecution") or {}
        value = present.state_of(unit)
        wid = present.last_id(unit.get("name", ""))
        row = (sweep or {}).get(wid) if isinstance(wid, int) else None
        cells: list[Any] = [str(wid)]
        if sweep is not None:
            cells.append(safe.plain((row or {}).get("jobName", "")))
        cells += [state(value), str(present.last_id(execution.get("name", ""))) if execution else ""]
        cells += [safe.plain(args.get(name, "")) for name in shown]
        if len(columns) > len(shown):
            cells.append(safe.plain(" ".join(f"{n}={args.get(n, '')}" for n in columns[len(shown):])))
        cells += [_last(row, metric) for metric in metrics]
        message = present.one_line(safe.clean(present.headline_of(unit)))
        cells.append(Text(message, style="red" if value in present.FAILED_STATES else "dim" if not message else ""))
        cells.append(present.duration(execution.get("createTime"), execution.get("completeTime")))
        table.add_row(*cells)
    return table


#: The system metrics XMC records per execution (the server's metrics/system_names.py).
SYSTEM_METRICS = ("system/gpu_utilization", "system/gpu_memory_used_bytes", "system/cpu_usage_cores",
                  "system/memory_working_set_bytes")


def _bytes(value: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value / 2**10:.0f} KiB"


def _system_cells(row: Mapping[str, Any] | None) -> list[str]:
    found = ((row or {}).get("metrics") or {})

    def last(name: str) -> float | None:
        value = (found.get(name) or {}).get("last")
        return float(value) if isinstance(value, (int, float)) else None

    gpu, gpu_mem, cpu, mem = (last(name) for name in SYSTEM_METRICS)
    return ["" if gpu is None else f"{gpu:.0%}", "" if gpu_mem is None else _bytes(gpu_mem),
            "" if cpu is None else f"{cpu:.2f}", "" if mem is None else _bytes(mem)]


def system_view(e: Mapping[str, Any], units: Sequence[Mapping[str, Any]], console: Console, *,
                sweep: Mapping[int, Mapping[str, Any]]) -> Group:
    """``xmc status --system``: per unit the last recorded GPU utilisation (mean over its GPUs), GPU memory
    used, CPU cores and memory working set of its current execution, and its message (an idle warning)."""
    if not units:
        return Group(experiment_header(e, units, width=console.width), Text(""), Text("No work units yet.", style="dim"))
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for name, justify in (("WID", "right"), ("STATE", "left"), ("GPU", "right"), ("GPU MEM", "right"),
                          ("CPU", "right"), ("MEM", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("MESSAGE", no_wrap=True, overflow="ellipsis", ratio=1, min_width=10)
    for unit in units:
        wid = present.last_id(unit.get("name", ""))
        row = sweep.get(wid) if isinstance(wid, int) else None
        value = present.state_of(unit)
        message = present.one_line(safe.clean(present.headline_of(unit)))
        table.add_row(str(wid), state(value), *_system_cells(row),
                      Text(message, style="red" if value in present.FAILED_STATES else "dim" if not message else ""))
    return Group(experiment_header(e, units, width=console.width), Text(""), fit(table, console))


def status_view(e: Mapping[str, Any], units: Sequence[Mapping[str, Any]], console: Console, *,
                sweep: Mapping[int, Mapping[str, Any]] | None = None, metrics: Sequence[str] = ()) -> Group:
    body = (fit(units_table(units, sweep=sweep, metrics=metrics), console) if units
            else Text("No work units yet.", style="dim"))
    return Group(experiment_header(e, units, width=console.width), Text(""), body)


def unit_summary(unit: Mapping[str, Any], sweep: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The stable, flat record of a work unit ``--json`` outputs beside the raw resource (with ``sweep``,
    the sweep read's rows by wid: also its job name and metric summaries)."""
    execution = unit.get("currentWorkUnitExecution") or {}
    wid = present.last_id(unit.get("name", ""))
    row = (sweep or {}).get(wid) if isinstance(wid, int) else None
    extra = {"jobName": row.get("jobName", ""), "metrics": row.get("metrics") or {}} if row is not None else {}
    return {
        **extra,
        "wid": wid,
        "state": present.state_of(unit),
        "execution": present.last_id(execution.get("name", "")) if execution else None,
        "args": present.args_of(unit),
        "message": present.last_message(unit),
        "headline": str(unit.get("headline") or ""),
        "sentence": present.sentence_of(unit),
        "reason": unit.get("reason") or {},
        "startTime": execution.get("createTime"),
        "completeTime": execution.get("completeTime"),
    }


def experiment_summary(e: Mapping[str, Any]) -> dict[str, Any]:
    status = e.get("status") or {}
    return {
        "xid": present.xid_of(e.get("name", "")),
        "title": e.get("title", ""),
        "owner": e.get("creator", ""),
        "activeState": status.get("activeState"),
        "launchState": status.get("launchState"),
        "stateCounts": present.state_counts(e),
        "severityCounts": present.severity_counts(e),
        "createTime": e.get("createTime"),
        "completeTime": e.get("completeTime"),
    }
