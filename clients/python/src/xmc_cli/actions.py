"""``xmc stop`` and ``xmc restart``: one call per work unit, then wait on the operations.

Each work unit gets its own ``:stop`` / ``:restart`` call (so each gets its
own result, as the researcher pages do), then the long-running operations
are polled (``GET /v1/<operation name>``) until done, with a progress bar on
stderr, and a per-unit result is printed. More than one unit needs a
confirmation: a yes at the prompt, or ``--yes``.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from xmc_cli import present, render, safe
from xmc_cli.errors import EXIT_FAILED, EXIT_OK, CliError, NotFound, UsageError
from xmc_cli.targets import parse

POLL_S = 0.5
DONE_WORDS = {"stop": "stopped", "restart": "restarted"}


@dataclass
class Unit:
    xid: int
    wid: int
    operation: str = ""
    done: bool = False
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    #: stop: the unit had ended before (its final state): nothing to do, and not a failure
    already: str = ""

    @property
    def result(self) -> str:
        if self.error:
            return "failed"
        if self.already:
            return "already"
        return "done" if self.done else "pending"


def _resolve(ctx: Any, targets: list[str], verb: str) -> list[Unit]:
    units: list[Unit] = []
    for text in targets:
        target = parse(text)
        if target.wids:
            ctx.api.experiment(target.xid)  # a stranger's experiment is "not found" before anything is sent
            units.extend(Unit(target.xid, w) for w in target.wids)
            continue
        every = ctx.api.work_units(target.xid)
        chosen = [u for u in every if verb == "restart" or present.state_of(u) not in present.TERMINAL]
        if not every:
            raise CliError(f"experiment {target.xid} has no work units")
        if not chosen:
            raise CliError(f"nothing to stop: every work unit of experiment {target.xid} has finished")
        units.extend(Unit(target.xid, present.last_id(u.get("name", ""))) for u in chosen)
    seen: set[tuple[int, int]] = set()
    return [u for u in units if not ((u.xid, u.wid) in seen or seen.add((u.xid, u.wid)))]  # type: ignore[func-returns-value]


def _confirm(ctx: Any, units: list[Unit], verb: str, yes: bool) -> None:
    if len(units) <= 1 or yes:
        return
    names = ", ".join(f"{u.xid}/{u.wid}" for u in units[:8]) + (f" and {len(units) - 8} more" if len(units) > 8 else "")
    if not sys.stdin.isatty():
        raise UsageError(f"{verb} {len(units)} work units ({names})? Not a terminal to ask in: pass --yes")
    ctx.err.print(f"{verb.capitalize()} {len(units)} work units ({names})? [y/N] ", end="")
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("nothing done")


def _error_text(error: dict[str, Any]) -> str:
    return str(error.get("message") or error.get("status") or f"code {error.get('code')}")


def cmd_act(ctx: Any, args: argparse.Namespace) -> int:
    verb: str = args.verb
    units = _resolve(ctx, args.targets, verb)
    _confirm(ctx, units, verb, args.yes)
    for unit in units:
        try:
            operation = ctx.api.act(unit.xid, unit.wid, verb)
        except NotFound:
            unit.error = f"work unit {unit.xid}/{unit.wid} not found"
            continue
        except CliError as exc:
            if exc.status in ("UNAUTHENTICATED",):
                raise
            state = _final_state(ctx, unit) if verb == "stop" and exc.status == "FAILED_PRECONDITION" else ""
            if state:
                unit.already = state  # stopping what has ended is what the user wanted: done already
            else:
                unit.error = exc.message
            continue
        unit.operation = str(operation.get("name") or "")
        unit.detail = operation
        if operation.get("done"):
            unit.done = True
            if operation.get("error"):
                state = _final_state(ctx, unit) if verb == "stop" and operation["error"].get("code") == 9 else ""
                if state:  # 9: FAILED_PRECONDITION, the unit had ended
                    unit.already = state
                else:
                    unit.error = _error_text(operation["error"])
    if not args.no_wait:
        _wait(ctx, units, verb, args.timeout)
    return _report(ctx, units, verb, args)


def _final_state(ctx: Any, unit: Unit) -> str:
    """The unit's state when it has ended (COMPLETED, FAILED, STOPPED), else ""."""
    try:
        state = present.state_of(ctx.api.work_unit(unit.xid, unit.wid))
    except CliError:
        return ""
    return state if state in present.TERMINAL else ""


def _wait(ctx: Any, units: list[Unit], verb: str, timeout: float) -> None:
    pending = [u for u in units if u.operation and not u.done and not u.error]
    if not pending:
        return
    deadline = time.monotonic() + timeout
    progress = Progress(TextColumn(f"{verb.capitalize()}ping" if verb == "stop" else "Restarting"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=ctx.err, transient=True,
                        disable=not ctx.err.is_terminal)
    with progress:
        task = progress.add_task(verb, total=len(units), completed=len(units) - len(pending))
        while pending and time.monotonic() < deadline:
            time.sleep(POLL_S)
            for unit in list(pending):
                operation = ctx.api.operation(unit.operation)
                if operation.get("done"):
                    unit.done, unit.detail = True, operation
                    if operation.get("error"):
                        unit.error = _error_text(operation["error"])
                    pending.remove(unit)
                    progress.advance(task)
    for unit in pending:
        unit.error = f"not done after {timeout:.0f} s (operation {unit.operation}); see xmc status {unit.xid}"


def _report(ctx: Any, units: list[Unit], verb: str, args: argparse.Namespace) -> int:
    failed = [u for u in units if u.error]
    if args.json:
        ctx.json({"verb": verb, "results": [
            {"xid": u.xid, "wid": u.wid, "operation": u.operation or None, "done": u.done,
             "result": u.result, "error": u.error or None, **({"state": u.already} if u.already else {})}
            for u in units]})
        return EXIT_FAILED if failed else EXIT_OK
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    table.add_column("UNIT", no_wrap=True)
    table.add_column("RESULT", no_wrap=True)
    table.add_column("DETAIL", overflow="fold")
    for u in units:
        if u.error:
            result = Text("✗ failed", style="bold red")
        elif u.already:
            result = Text(f"– already {u.already.lower()}", style="dim")
        elif u.done:
            result = Text(f"✓ {DONE_WORDS[verb]}", style="green")
        else:
            result = Text("… requested", style="yellow")
        table.add_row(f"{u.xid}/{u.wid}", result, safe.plain(u.error or ("nothing to stop" if u.already else u.operation)))
    ctx.out.print(render.fit(table, ctx.out))
    return EXIT_FAILED if failed else EXIT_OK
