"""``xmc study create|show|stop|list``: a hyperparameter study XMC runs server-side.

``create --from XID/WID`` clones that work unit per trial with the arguments the
sampler picks (``--param NAME=KIND:...``, `xmc_cli.study_spec`); ``show`` prints the
study, its best trial and the trials table; ``stop`` ends it (running trials
are stopped by the server); ``list`` the studies of an experiment. A study is
named ``XID/SID`` (or ``experiments/XID/studies/SID``, or its page URL).
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from xmc_cli import compare, present, render, safe, study_spec
from xmc_cli.errors import EXIT_OK, EXIT_USAGE, UsageError
from xmc_cli.targets import parse

_STUDY = re.compile(r"(?:^|/)experiments/(\d{1,18})/studies/(\d{1,18})/?$")
_SHORT = re.compile(r"^(\d{1,18})/(\d{1,18})$")
#: Trial states beside the work unit ones (`xmc_cli.present.STATES`).
_TRIAL_STYLE = {"PRUNED": ("✂", "yellow")}
#: Columns of parameters the table shows at most (all of them are in --json).
MAX_PARAM_COLUMNS = 5


def spec_arg(parse_one: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type=`` of a `xmc_cli.study_spec` parser: its error becomes argparse's (which names the flag)."""

    def parse_arg(text: str) -> Any:
        try:
            return parse_one(text)
        except study_spec.SpecError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse_arg.__name__ = parse_one.__name__
    return parse_arg


def study_ref(text: str) -> tuple[int, int]:
    """``12/3``, ``experiments/12/studies/3`` or the study page's URL -> (xid, sid)."""
    raw = text.strip()
    match = _STUDY.search(raw.split("?", 1)[0].split("#", 1)[0]) or _SHORT.match(raw)
    if not match:
        hint = f" (a study is named by its experiment too: XID/{raw})" if raw.isascii() and raw.isdigit() else ""
        raise UsageError(f"bad study {text!r}: expected XID/SID, e.g. 12/3{hint}")
    xid, sid = int(match.group(1)), int(match.group(2))
    if xid < 1 or sid < 1:
        raise UsageError(f"bad study {text!r}: ids start at 1")
    return xid, sid


def _sid_of(study: Mapping[str, Any]) -> str:
    return str(study.get("name", "")).rstrip("/").rsplit("/", 1)[-1]


def trial_counts(study: Mapping[str, Any]) -> dict[str, int]:
    """Trials per state: the server's ``trialCounts``, else counted from the trials it sent."""
    given = study.get("trialCounts")
    if isinstance(given, Mapping):
        return {str(k): int(v) for k, v in given.items()}
    counts: dict[str, int] = {}
    for trial in study.get("trials") or []:
        counts[str(trial.get("state"))] = counts.get(str(trial.get("state")), 0) + 1
    return counts


def trial_state(value: str) -> Text:
    if value in _TRIAL_STYLE:
        glyph, style = _TRIAL_STYLE[value]
        return Text(f"{glyph} {value.lower()}", style=style, no_wrap=True)
    return render.state(value)


def describe_space(parameters: Mapping[str, Any]) -> str:
    """``lr=log:1e-05:0.1 batch_size=choice:32,64`` (the typed form of a wire space)."""
    back = {"logUniform": "log", "uniform": "uniform", "int": "int", "choice": "choice"}
    parts = []
    for name, spec in parameters.items():
        ((key, values),) = spec.items() if isinstance(spec, Mapping) and len(spec) == 1 else (("?", []),)
        joined = ",".join(map(str, values)) if key == "choice" else ":".join(map(str, values))
        parts.append(f"{name}={back.get(key, key)}:{joined}")
    return " ".join(parts)


def describe_objective(objective: Mapping[str, Any]) -> str:
    arrow = "↓" if str(objective.get("goal", "")).upper().startswith("MIN") else "↑"
    return f"{objective.get('metric', '?')} ({objective.get('stat', 'last')}) {arrow}"


def describe_pruner(pruner: Any) -> str:
    if not isinstance(pruner, Mapping) or not pruner:
        return "none"
    ((kind, settings),) = list(pruner.items())[:1]
    words = ", ".join(f"{k} {v}" for k, v in (settings or {}).items())
    return f"{kind}" + (f" ({words})" if words else "")


def header(xid: int, study: Mapping[str, Any], width: int) -> Text:
    counts = trial_counts(study)
    text = Text()
    text.append(f"Study {xid}/{_sid_of(study)}", style="bold")
    text.append("  ")
    text.append_text(trial_state(str(study.get("state", ""))))
    facts = [f"from work unit {xid}/{study.get('templateWorkUnit', '?')}",
             f"objective {describe_objective(study.get('objective') or {})}",
             f"sampler {study.get('sampler', '?')}", f"pruner {describe_pruner(study.get('pruner'))}",
             f"{sum(counts.values())} of {study.get('maxTrials', '?')} trials, at most "
             f"{study.get('parallelTrials', '?')} at once"]
    text.append("\n" + render.pack([safe.clean(f) for f in facts], width), style="dim")
    if counts:
        text.append("\nTrials ")
        text.append(" ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()) if n))
    space = describe_space(study.get("parameters") or {})
    if space:
        text.append("\nSpace ", style="dim")
        text.append(safe.clean(present.one_line(space, 300)), style="dim")
    return text


def best_line(xid: int, study: Mapping[str, Any]) -> Text:
    best = study.get("bestTrial")
    objective = study.get("objective") or {}
    if not isinstance(best, Mapping) or not best:
        return Text("No best trial yet (no trial has completed with the objective).", style="dim")
    text = Text("Best ", style="bold")
    text.append(f"trial {best.get('number')} (work unit {xid}/{best.get('workUnit')}): ")
    text.append(f"{objective.get('metric', 'value')} {compare.fmt(best.get('value'))}", style="bold green")
    params = best.get("parameters") or {}
    if params:
        text.append("  " + safe.clean(" ".join(f"{k}={compare.fmt(v)}" for k, v in params.items())))
    return text


def trials_table(study: Mapping[str, Any]) -> Table:
    trials = list(study.get("trials") or [])
    names = list((study.get("parameters") or {}).keys()) or sorted(
        {k for t in trials for k in (t.get("parameters") or {})})
    objective = study.get("objective") or {}
    best = (study.get("bestTrial") or {}).get("number")
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for title, justify in (("#", "right"), ("WID", "right"), ("STATE", "left")):
        table.add_column(title, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for name in names[:MAX_PARAM_COLUMNS]:
        table.add_column(name, justify="right", no_wrap=True, overflow="ellipsis", max_width=12)
    table.add_column(describe_objective(objective), justify="right", no_wrap=True, style="bold")  # *: the best
    table.add_column("PRUNED AT", justify="right", no_wrap=True)
    hidden = names[MAX_PARAM_COLUMNS:]
    if hidden:  # said, not dropped: --json has every parameter
        table.caption = f"{len(hidden)} more parameter{'s' if len(hidden) != 1 else ''} not shown: " \
                        f"{', '.join(safe.clean(n) for n in hidden)} (--json shows every one)"
    for trial in sorted(trials, key=lambda t: int(t.get("number") or 0)):
        params = trial.get("parameters") or {}
        number = str(trial.get("number", ""))
        table.add_row(Text(("*" if trial.get("number") == best and best is not None else "") + number,
                           style="bold" if trial.get("number") == best else ""),
                      str(trial.get("workUnit") or ""), trial_state(str(trial.get("state", ""))),
                      *(safe.clean(compare.fmt(params.get(n))) for n in names[:MAX_PARAM_COLUMNS]),
                      compare.fmt(trial.get("value")),
                      "" if trial.get("prunedAtStep") in (None, "") else f"step {trial.get('prunedAtStep')}")
    return table


# --- commands -------------------------------------------------------------------------------------


def cmd_create(ctx: Any, args: argparse.Namespace) -> int:
    target = parse(args.source, need_wid=True, one_wid=True)
    if not args.param:
        raise UsageError("xmc study create: give at least one --param NAME=KIND:..., e.g. --param lr=log:1e-5:1e-1")
    space: dict[str, Any] = {}
    for name, spec in args.param:
        if name in space:
            raise UsageError(f"xmc study create: argument --param: {name!r} is given twice")
        space[name] = spec
    try:
        body = study_spec.study_body(target.wids[0], space, args.objective, max_trials=args.max_trials,
                                     parallel_trials=args.parallel, sampler_name=args.sampler)
    except study_spec.SpecError as exc:
        flag = "--parallel" if str(exc).startswith("parallelTrials") else "--param"
        raise UsageError(f"xmc study create: argument {flag}: {exc}") from None
    body["pruner"] = args.pruner
    created = ctx.api.create_study(target.xid, body)
    if args.json:
        ctx.json(created)
        return EXIT_OK
    sid = _sid_of(created)
    ctx.out.print(Text(f"Created study {target.xid}/{sid}", style="bold"),
                  Text(f" ({created.get('state', 'RUNNING').lower()}): {len(space)} parameters, up to "
                       f"{body['maxTrials']} trials, {body['parallelTrials']} at once"), sep="")
    ctx.out.print(Text(f"xmc study show {target.xid}/{sid}", style="dim"))
    return EXIT_OK


def cmd_show(ctx: Any, args: argparse.Namespace) -> int:
    xid, sid = study_ref(args.study)
    study = ctx.api.study(xid, sid)
    if args.json:
        ctx.json(study)
        return EXIT_OK
    ctx.out.print(header(xid, study, ctx.out.width))
    ctx.out.print(best_line(xid, study))
    if study.get("trials"):
        ctx.out.print(render.fit(trials_table(study), ctx.out))
    else:
        ctx.err.print("No trials yet.")
    return EXIT_OK


def cmd_stop(ctx: Any, args: argparse.Namespace) -> int:
    xid, sid = study_ref(args.study)
    study = ctx.api.stop_study(xid, sid)
    if args.json:
        ctx.json(study)
        return EXIT_OK
    running = trial_counts(study).get("RUNNING", 0)
    ctx.out.print(Text(f"Study {xid}/{sid} ", style="bold"), trial_state(str(study.get("state", ""))),
                  Text(f" ({running} running trials are being stopped)" if running else ""), sep="")
    return EXIT_OK


def list_table(xid: int, studies: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for title in ("STUDY", "STATE", "FROM", "OBJECTIVE", "TRIALS", "BEST"):
        table.add_column(title, no_wrap=True, overflow="ellipsis")
    for study in studies:
        best = study.get("bestTrial") or {}
        table.add_row(f"{xid}/{_sid_of(study)}", trial_state(str(study.get("state", ""))),
                      f"{xid}/{study.get('templateWorkUnit', '?')}",
                      safe.clean(describe_objective(study.get("objective") or {})),
                      f"{sum(trial_counts(study).values()) if 'trialCounts' in study else '?'}/{study.get('maxTrials', '?')}",
                      "" if not best else f"{compare.fmt(best.get('value'))} (#{best.get('number')})")
    return table


def cmd_list(ctx: Any, args: argparse.Namespace) -> int:
    target = parse(args.target)
    if target.wids:
        raise UsageError("xmc study list takes an experiment (XID)")
    studies = ctx.api.studies(target.xid, limit=args.limit)
    if args.json:
        ctx.json({"studies": studies})
        return EXIT_OK
    if not studies:
        ctx.err.print(f"Experiment {target.xid} has no studies.")
        return EXIT_OK
    ctx.out.print(render.fit(list_table(target.xid, studies), ctx.out))
    return EXIT_OK


def add_commands(command: Callable[[str, str], argparse.ArgumentParser], positive: Callable[[str], int]) -> None:
    """``xmc study ...`` under the main parser (``command`` makes a subcommand parser)."""
    study = command("study", "hyperparameter studies XMC runs: create, show, stop, list")
    sub = study.add_subparsers(dest="study_command", metavar="ACTION", parser_class=type(study))

    def usage(ctx: Any, args: argparse.Namespace) -> int:  # ``xmc study`` alone: its actions
        study.print_help()
        return EXIT_USAGE

    study.set_defaults(run=usage)

    p = sub.add_parser("create", help="start a study that clones a work unit per trial",
                       description="Start a study: XMC samples the parameters, runs up to --parallel trials at "
                                   "once (each a copy of the --from work unit with those arguments), prunes "
                                   "the unpromising ones and keeps the best.")
    p.add_argument("--from", dest="source", required=True, metavar="XID/WID", help="the template work unit")
    p.add_argument("--param", action="append", type=spec_arg(study_spec.parameter), metavar="NAME=KIND:...",
                   help="a searched argument: lr=log:1e-5:1e-1, dropout=uniform:0:0.5, layers=int:2:8, "
                        "batch_size=choice:32,64,128 (repeat for each)")
    p.add_argument("--objective", required=True, type=spec_arg(study_spec.objective),
                   metavar="METRIC[:STAT][:GOAL]", help="what to optimise, e.g. loss:last:min or accuracy:max:max")
    p.add_argument("--max-trials", type=positive, default=20, metavar="N", help="trials in all (default 20)")
    p.add_argument("--parallel", type=positive, default=1, metavar="N", help="trials running at once (default 1)")
    p.add_argument("--sampler", type=spec_arg(study_spec.sampler), default="tpe",
                   help=f"{', '.join(study_spec.SAMPLERS)} (default tpe)")
    p.add_argument("--pruner", type=spec_arg(study_spec.pruner), default=None,
                   metavar="median[:WARMUP]|sha[:MIN[:FACTOR]]|none", help="early stopping (default none)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_create)

    p = sub.add_parser("show", help="a study: its best trial and its trials")
    p.add_argument("study", metavar="XID/SID")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_show)

    p = sub.add_parser("stop", help="stop a study (its running trials are stopped)")
    p.add_argument("study", metavar="XID/SID")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_stop)

    p = sub.add_parser("list", help="the studies of an experiment")
    p.add_argument("target", metavar="XID")
    p.add_argument("--limit", type=positive, default=50, metavar="N", help="at most N studies (default 50)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_list)
