"""The ``xmc`` command: argument parsing, the read commands, and one error line per failure.

Exit codes (the same for every command, `xmc_cli.errors`): 0 done; 1 a work
unit failed (``watch``) or an action failed (``stop``/``restart``); 2 bad
arguments; 3 ``watch`` ended with stopped work units and none failed; 4 an
error (not logged in, not found, no permission, server unreachable).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import webbrowser
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from xmc_cli import __version__, actions, auth, cluster, compare, logs, present, render, safe, study, watch
from xmc_cli.api import Api
from xmc_cli.errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError, UsageError
from xmc_cli.targets import parse

STATE_NAMES = tuple(s for s, *_ in present.STATES)
ACTIVE_STATES = ("ACTIVE", "INACTIVE")


class Context:
    """What every command gets: the environment, the API (made on first use) and the two consoles."""

    def __init__(self, env: Mapping[str, str], out: Console, err: Console) -> None:
        self.env, self.out, self.err = env, out, err
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = Api(auth.identity(self.env))
        return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()

    def json(self, value: Any) -> None:
        self.out.file.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
        self.out.file.flush()


# --- list -----------------------------------------------------------------------------------------


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _state_arg(text: str) -> str:
    value = text.strip().upper().replace("-", "_")
    aliases = {"QUEUED": "SCHEDULING", "DONE": "COMPLETED", "PAUSED": "SCHEDULING_PAUSED"}
    value = aliases.get(value, value)
    if value not in STATE_NAMES and value not in ACTIVE_STATES:
        raise argparse.ArgumentTypeError(
            f"unknown state {text!r}: one of active, inactive, or a work unit state ({', '.join(s.lower() for s in STATE_NAMES)})")
    return value


def cmd_list(ctx: Context, args: argparse.Namespace) -> int:
    parts = []
    if args.mine:
        email = ctx.api.ident.email
        if not email:
            raise CliError("--mine needs your email, and the token carries none: use --filter 'creator = \"you@...\"'")
        parts.append(f"creator = {_quote(email)}")
    by_unit_state = ""
    if args.state in ACTIVE_STATES:
        parts.append(f"status.active_state = {args.state}")
    elif args.state:
        by_unit_state = args.state
    if args.filter:
        parts.append(f"({args.filter})")
    filter_text = " AND ".join(parts)
    if by_unit_state:  # no server filter on the roll-up: page through and keep those with such a unit
        found = [e for e in ctx.api.experiments(filter=filter_text)
                 if present.state_counts(e).get(by_unit_state)][: args.limit]
    else:
        found = list(ctx.api.experiments(filter=filter_text, limit=args.limit))
    if args.json:
        ctx.json({"experiments": [{**render.experiment_summary(e), "experiment": e} for e in found]})
        return EXIT_OK
    if not found:
        ctx.err.print("No experiments" + (" match." if filter_text or by_unit_state else " yet."))
        return EXIT_OK
    ctx.out.print(render.fit(render.experiments_table(found), ctx.out))
    return EXIT_OK


# --- status ---------------------------------------------------------------------------------------


#: What the server's headlines read says of a unit (``workunits.headline.describe`` on the server).
HEADLINE_FIELDS = ("headline", "sentence", "reason")


def with_headlines(ctx: Context, xid: int, units: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put the server's why on each unit (``headline``, ``sentence``, ``reason``); an older server without the
    endpoint (or without a field) adds none of it, and the client words nothing of its own in its place."""
    try:
        headlines = ctx.api.headlines(xid)
    except CliError:
        return units
    return [{**u, **{k: v for k, v in headlines.get(str(u.get("name")), {}).items() if k in HEADLINE_FIELDS}}
            for u in units]


def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    target = parse(args.target)
    experiment = ctx.api.experiment(target.xid)
    units = with_headlines(ctx, target.xid, ctx.api.work_units(target.xid))
    if target.wids:
        wanted = set(target.wids)
        units = [u for u in units if present.last_id(u.get("name", "")) in wanted]
        missing = sorted(wanted - {present.last_id(u.get("name", "")) for u in units})
        if missing:
            raise CliError(f"work unit {target.xid}/{missing[0]} not found")
    if args.system:
        _, rows = ctx.api.summarize(target.xid, metrics=render.SYSTEM_METRICS)
        sweep, metrics = {int(row["workUnitId"]): row for row in rows}, list(render.SYSTEM_METRICS)
    else:
        sweep, metrics = _sweep_rows(ctx, target.xid)
    if args.json:
        ctx.json({"experiment": experiment, "summary": render.experiment_summary(experiment), "metrics": metrics,
                  "workUnits": [{**render.unit_summary(u, sweep), "workUnit": u} for u in units]})
        return EXIT_OK
    if args.system:
        ctx.out.print(render.system_view(experiment, units, ctx.out, sweep=sweep))
        return EXIT_OK
    ctx.out.print(render.status_view(experiment, units, ctx.out, sweep=sweep, metrics=metrics))
    return EXIT_OK


def _sweep_rows(ctx: Context, xid: int) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """``wid -> row`` of the sweep read (job name, the last value of up to three metrics) and those metrics."""
    head, _ = ctx.api.summarize(xid, limit=1)
    metrics = compare.metric_columns(list(head.get("metrics") or []))
    _, rows = ctx.api.summarize(xid, metrics=metrics)  # no metrics: the experiment's, which are none
    return {int(row["workUnitId"]): row for row in rows}, metrics


# --- why ------------------------------------------------------------------------------------------


def cmd_why(ctx: Context, args: argparse.Namespace) -> int:
    target = parse(args.target, need_wid=True, one_wid=True)
    xid, wid = target.xid, target.wids[0]
    (unit,) = with_headlines(ctx, xid, [ctx.api.work_unit(xid, wid)])
    messages = ctx.api.status_messages(xid, wid, limit=3)
    reasons = present.why(unit, messages)
    if args.json:
        ctx.json({"xid": xid, "wid": wid, "state": present.state_of(unit), "sentence": present.sentence_of(unit),
                  "reason": unit.get("reason") or {}, "reasons": reasons, "workUnit": unit, "statusMessages": messages})
        return EXIT_OK
    state = present.state_of(unit)
    ctx.out.print(Text(f"{xid}/{wid} ", style="bold"), render.state(state), sep="", end="  ")
    ctx.out.print(safe.plain(reasons[0], style="dim"))
    for line in reasons[1:]:
        ctx.out.print(Padding(safe.plain(line), (0, 0, 0, 2)))
    return EXIT_OK


# --- open -----------------------------------------------------------------------------------------


def _browser_here(env: Mapping[str, str]) -> bool:
    if env.get("SSH_CONNECTION") or env.get("SSH_TTY"):
        return False
    return sys.platform == "darwin" or bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")) or os.name == "nt"


def cmd_open(ctx: Context, args: argparse.Namespace) -> int:
    target = parse(args.target, one_wid=True)
    if target.wids:
        ctx.api.work_unit(target.xid, target.wids[0])  # not found / no access: say so, do not open a 404 page
        path = f"/experiments/{target.xid}/workUnits/{target.wids[0]}"
    else:
        ctx.api.experiment(target.xid)
        path = f"/experiments/{target.xid}"
    url = auth.ui_base(ctx.env, ctx.api.ident.origin) + path
    if args.json:
        ctx.json({"url": url})
        return EXIT_OK
    ctx.out.print(safe.plain(url), highlight=False, soft_wrap=True)
    if not args.no_browser and ctx.out.is_terminal and _browser_here(ctx.env):
        try:
            webbrowser.open(url)
        except webbrowser.Error:
            pass
    return EXIT_OK


# --- parsing --------------------------------------------------------------------------------------


_SINCE = re.compile(r"^(\d+)([smhd])$")


def since_arg(text: str) -> timedelta:
    match = _SINCE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"bad --since {text!r}: a number and s, m, h or d (e.g. 10m)")
    n, unit = int(match.group(1)), match.group(2)
    return timedelta(**{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: n})


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="xmc", description="XMC from the terminal. Server: XMC_API_URL (or XMANAGER_UI_URL); "
                     "identity: XMC_AUTH_TOKEN, else the login `xmanager login` saved.")
    parser.add_argument("--version", action="version", version=f"xmc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help)

    p = command("list", "experiments you can see, newest first")
    p.add_argument("--mine", action="store_true", help="only experiments you created")
    p.add_argument("--state", type=_state_arg, help="active or inactive, or a work unit state some unit is in (running, failed, ...)")
    p.add_argument("--filter", default="", help="an AIP-160 filter, e.g. 'title:\"sweep\" AND priority = HIGH'")
    p.add_argument("--limit", type=_positive, default=20, help="at most N experiments (default 20)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_list)

    p = command("status", "an experiment and its work units")
    p.add_argument("target", metavar="XID[/WID]")
    p.add_argument("--system", action="store_true",
                   help="each unit's GPU utilisation, GPU memory, CPU and memory (the last recorded system metrics)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_status)

    p = command("compare", "a sweep's work units ranked by a metric (best first)")
    p.add_argument("target", metavar="XID")
    p.add_argument("--metric", type=compare.metric_arg, metavar="NAME[:min|:max]",
                   help="rank by this metric's last value; :min lower is better, :max higher (default: by its "
                        "name, lower for loss/error); default metric: the experiment's first loss-like one")
    p.add_argument("--filter", default="", help="an AIP-160 filter, e.g. 'args.lr < 0.01 AND state = COMPLETED'")
    p.add_argument("--top", type=_positive, default=20, metavar="N", help="the best N (default 20)")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_argument("--csv", action="store_true", help="CSV: args and every stat of the metrics shown")
    p.set_defaults(run=compare.cmd_compare)

    p = command("why", "in plain words: why a work unit is not running, or why it failed")
    p.add_argument("target", metavar="XID/WID")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_why)

    p = command("logs", "a work unit's logs (live from its pods, or archived)")
    p.add_argument("target", metavar="XID/WID")
    p.add_argument("--replica", help="replica (main-0, ...; default: all of them, or the first with -f)")
    p.add_argument("--container", help="container (default: the pod's first)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="wait for the first pod, then keep printing new lines until the container ends")
    p.add_argument("--follow-restarts", action="store_true",
                   help="as -f, then on to the next execution after each restart, until the unit ends")
    p.add_argument("--tail", type=_non_negative, metavar="N", help="the last N lines")
    p.add_argument("--since", type=since_arg, metavar="DURATION", help="lines of the last 10m, 2h, 1d, ...")
    p.add_argument("--execution", type=_positive, metavar="E", help="an earlier execution (default: the current one)")
    p.add_argument("--previous", action="store_true", help="the container's instance before its last restart")
    p.add_argument("--timestamps", action="store_true", help="print each line's time")
    p.add_argument("--json", action="store_true", help="one JSON object per line (NDJSON)")
    p.set_defaults(run=logs.cmd_logs)

    for verb, words in (("stop", "stop work units"), ("restart", "restart work units (each gets a new execution)")):
        p = command(verb, words + ": XID for every unit, XID/WID, XID/3,5 or XID/3-7")
        p.add_argument("targets", nargs="+", metavar="XID[/WID...]")
        p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation (needed for more than one unit)")
        p.add_argument("--no-wait", action="store_true", help="return once the requests are accepted")
        p.add_argument("--timeout", type=_positive, default=300, metavar="S", help="how long to wait (default 300 s)")
        p.add_argument("--json", action="store_true", help="machine-readable result per unit")
        p.set_defaults(run=actions.cmd_act, verb=verb)

    p = command("watch", "a live table until the experiment finishes; exit 0 all completed, 1 some failed, 3 stopped")
    p.add_argument("target", metavar="XID")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="polling interval without live events (default 2)")
    p.add_argument("--no-events", action="store_true", help="poll only, never the server-sent events")
    p.add_argument("--timeout", type=float, default=0.0, metavar="S", help="give up after S seconds (exit 4); 0: never")
    p.add_argument("--json", action="store_true", help="one JSON line per change (NDJSON), then a final summary line")
    p.set_defaults(run=watch.cmd_watch)

    p = command("open", "print (and open, when a browser is there) the page of an experiment or work unit")
    p.add_argument("target", metavar="XID[/WID]")
    p.add_argument("--no-browser", action="store_true", help="only print the URL")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_open)

    study.add_commands(command, _positive)
    cluster.add_commands(command, _positive)
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    environment = os.environ if env is None else env
    # No markup or emoji codes, ever: server text is printed as written (xmc_cli.safe).
    out = Console(highlight=False, soft_wrap=False, markup=False, emoji=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)
    ctx = Context(environment, out, err)
    try:
        parser = build_parser()
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        if not getattr(args, "run", None):
            parser.print_help()
            return EXIT_USAGE
        code: int = args.run(ctx, args)
        return code
    except CliError as exc:
        err.print(Text("xmc:", style="bold red"), safe.plain(exc.message), highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("xmc: interrupted")
        return 130
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's flush at exit
        except OSError:
            pass
        return EXIT_OK
    finally:
        ctx.close()


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
