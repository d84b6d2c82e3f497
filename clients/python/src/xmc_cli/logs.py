"""``xmc logs XID/WID``: an execution's logs, live from its pods or archived after them.

One endpoint, ``GET /v1/experiments/{xid}/workUnits/{wid}/executions/{eid}/logs``
(docs/architecture/logs.md in the XMC checkout), asked for NDJSON: one
object per line with ``replica``, ``pod``, ``container``, ``timestamp``,
``text`` and ``source``. Without ``--replica`` every replica is read
(``replica=all``, interleaved by time); with ``-f`` the server follows one
replica per request, so each replica gets its own followed stream, in a
thread, and lines are printed as they come. With several replicas each line
is prefixed with its replica, in a colour of its own.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
from rich.text import Text

from xmc_cli import present, safe
from xmc_cli.errors import EXIT_OK, CliError, NotFound
from xmc_cli.targets import parse

COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_magenta")
MAX_FOLLOWED_REPLICAS = 8
WAIT_FOR_POD_S = 2.0


class Printer:
    def __init__(self, ctx: Any, *, as_json: bool, timestamps: bool, prefix: bool) -> None:
        self.ctx, self.as_json, self.timestamps, self.prefix = ctx, as_json, timestamps, prefix
        self.lock = threading.Lock()
        self.colours: dict[str, str] = {}
        self.width = 0

    def line(self, record: dict[str, Any]) -> None:
        with self.lock:
            if self.as_json:
                self.ctx.out.file.write(json.dumps(record) + "\n")
                self.ctx.out.file.flush()
                return
            text = Text(no_wrap=False)
            replica = str(record.get("replica") or "")
            if self.prefix and replica:
                colour = self.colours.setdefault(replica, COLOURS[len(self.colours) % len(COLOURS)])
                self.width = max(self.width, len(replica))
                text.append(f"{safe.clean(replica):<{self.width}} │ ", style=colour)
            if self.timestamps and record.get("timestamp"):
                text.append(f"{safe.clean(record['timestamp'])} ", style="dim")
            text.append(safe.clean(record.get("text", ""), tabs=True))
            self.ctx.out.print(text, highlight=False, markup=False, soft_wrap=True)
            self.ctx.out.file.flush()


def _query(args: argparse.Namespace, replica: str | None) -> dict[str, str]:
    params = {"format": "ndjson"}
    if replica:
        params["replica"] = replica
    if args.container:
        params["container"] = args.container
    if args.follow:
        params["follow"] = "true"
    if args.tail is not None:
        params["tailLines"] = str(args.tail)
    if args.since is not None:
        since = datetime.now(timezone.utc) - args.since
        params["sinceTime"] = since.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if args.previous:
        params["previous"] = "true"
    return params


class Stream:
    """One logs request; its headers are read before the first line."""

    def __init__(self, ctx: Any, path: str, params: dict[str, str], what: str) -> None:
        self.ctx, self.path, self.params, self.what = ctx, path, params, what
        api = ctx.api
        timeout = httpx.Timeout(connect=10.0, read=None if params.get("follow") else 60.0, write=10.0, pool=10.0)
        try:
            self._cm = api.http.stream("GET", path, params=params, timeout=timeout,
                                       headers={"Accept": "application/x-ndjson"})
            self.response = self._cm.__enter__()
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach XMC at {api.ident.origin}: {exc}") from None
        if not self.response.is_success:
            self.response.read()
            self.close()
            code = self.response.status_code
            if code == 404:
                message = _message(self.response)
                if "replica" in message or "container" in message:
                    raise CliError(message)
                raise NotFound(f"{what} not found")
            if code == 429 and params.get("follow"):
                raise CliError("the server follows only a few logs at once: try again, or name one --replica")
            api.raise_for(self.response, what=what)

    @property
    def headers(self) -> httpx.Headers:
        headers: httpx.Headers = self.response.headers
        return headers

    def records(self) -> Iterator[dict[str, Any]]:
        try:
            for raw in self.response.iter_lines():
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except ValueError:
                    record = {"text": raw}
                if isinstance(record, dict):
                    yield record
        except httpx.ReadError:
            return
        finally:
            self.close()

    def close(self) -> None:
        try:
            self._cm.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - closing a broken stream
            pass


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return ""


def _note(ctx: Any, headers: httpx.Headers, json_mode: bool) -> None:
    if json_mode:
        return
    source = headers.get("X-XMC-Log-Source", "")
    note = headers.get("X-XMC-Log-Note", "")
    if source == "none":
        ctx.err.print(safe.plain(f"No logs yet{': ' + note if note else '.'}", style="yellow"), highlight=False)
    elif source == "archive":
        when = headers.get("X-XMC-Log-Archived-At", "")
        truncated = " (only the last part was kept)" if headers.get("X-XMC-Log-Truncated") == "true" else ""
        ctx.err.print(safe.plain(f"Archived log{' taken at ' + when if when else ''}{truncated}.", style="dim"),
                      highlight=False)
    console = headers.get("X-XMC-Logs-Console-URL", "")
    if console and source in ("none", "archive"):
        ctx.err.print(safe.plain(f"Full logs: {console}", style="dim"), highlight=False)


def _waiting(headers: httpx.Headers) -> bool:
    """No container of the replica has started yet: a follower asks again instead of ending."""
    return bool(headers.get("X-XMC-Log-Waiting") == "true" or headers.get("X-XMC-Log-Source") == "none")


def _current_eid(ctx: Any, xid: int, wid: int) -> tuple[int, dict[str, Any]]:
    unit = ctx.api.work_unit(xid, wid)
    execution = unit.get("currentWorkUnitExecution") or {}
    return present.last_id(execution.get("name", "")), unit


def _say(ctx: Any, args: argparse.Namespace, text: str) -> None:
    """A line about the command itself (never data): stderr, and not in --json mode's stdout."""
    ctx.err.print(safe.plain(text, style="dim"), highlight=False)  # it may quote the server (a note, a headline)


class Seen:
    """What has been printed of each replica, so a catch-up read prints only what came after it."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[str, set[str]]] = {}
        self.lock = threading.Lock()
        self.count = 0

    def new(self, record: dict[str, Any]) -> bool:
        replica, stamp, text = str(record.get("replica") or ""), str(record.get("timestamp") or ""), str(record.get("text", ""))
        with self.lock:
            last_stamp, texts = self.last.get(replica, ("", set()))
            if stamp and stamp < last_stamp:
                return False
            if stamp and stamp == last_stamp:
                if text in texts:
                    return False
                texts.add(text)
            else:
                self.last[replica] = (stamp, {text})
            self.count += 1
            return True

    def since(self, replica: str) -> str | None:
        with self.lock:
            stamp = self.last.get(replica, ("", set()))[0]
        return stamp or None


def _follow_execution(ctx: Any, args: argparse.Namespace, xid: int, wid: int, eid: int,
                      seen: Seen, printer: Printer | None) -> tuple[bool, Printer | None]:
    """Follow execution ``eid`` to its last line. False when the unit ended before any pod started."""
    what = f"execution {eid} of work unit {xid}/{wid}"
    path = f"/v1/experiments/{xid}/workUnits/{wid}/executions/{eid}/logs"
    first = Stream(ctx, path, _query(args, args.replica), what)
    said = ""
    while _waiting(first.headers):  # -f before the pod started: wait for it, saying what for
        first.close()
        current, unit = _current_eid(ctx, xid, wid)
        state = present.state_of(unit)
        if state in present.TERMINAL or current != eid:
            return False, printer
        reasons = present.why(unit)
        note = first.headers.get("X-XMC-Log-Note", "")
        line = (f"Waiting for the first pod of execution {eid} of {xid}/{wid} ({state.lower()}): "
                f"{reasons[0] if reasons else ''}" + (f" {note}." if note and state not in ("SCHEDULING",) else ""))
        if line != said:
            _say(ctx, args, line)
            said = line
        time.sleep(WAIT_FOR_POD_S)
        first = Stream(ctx, path, _query(args, args.replica), what)
    replicas = [r for r in first.headers.get("X-XMC-Log-Replicas", "").split(",") if r]
    served = first.headers.get("X-XMC-Log-Replica", "")
    others = [] if args.replica else [r for r in replicas if r != served][: MAX_FOLLOWED_REPLICAS - 1]
    if printer is None:
        printer = Printer(ctx, as_json=args.json, timestamps=args.timestamps, prefix=bool(others))
    _note(ctx, first.headers, args.json)
    problems: list[str] = []

    def pump(stream: Stream) -> None:
        for record in stream.records():
            if seen.new(record):
                printer.line(record)

    def follow(replica: str) -> None:
        try:
            pump(Stream(ctx, path, _query(args, replica), what))
        except CliError as exc:
            problems.append(f"{replica}: {exc.message}")

    threads = [threading.Thread(target=follow, args=(r,), daemon=True) for r in others]
    for thread in threads:
        thread.start()
    pump(first)
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
    # The followed stream ends when the container stops, and may end before its last lines were
    # sent: read once more, from the newest line printed, and print what is new.
    for replica in [served, *others]:
        since = seen.since(replica)
        # From the newest line printed; with none printed, the window asked for (--tail 0 stays empty).
        catch_up = argparse.Namespace(**{**vars(args), "follow": False,
                                         **({"tail": None, "since": None} if since else {})})
        params = _query(catch_up, replica)
        if since:
            params["sinceTime"] = since
        try:
            pump(Stream(ctx, path, params, what))
        except CliError as exc:
            problems.append(f"{replica}: {exc.message}")
    for problem in problems:
        ctx.err.print(safe.plain(f"xmc: {problem}", style="yellow"), highlight=False)
    return True, printer


def cmd_logs(ctx: Any, args: argparse.Namespace) -> int:
    target = parse(args.target, need_wid=True, one_wid=True)
    xid, wid = target.xid, target.wids[0]
    if args.follow and args.previous:
        raise CliError("-f and --previous do not go together: a previous instance has ended")
    if getattr(args, "follow_restarts", False) and not args.follow:
        args.follow = True  # --follow-restarts is a kind of -f
    if getattr(args, "follow_restarts", False) and args.execution is not None:
        raise CliError("--follow-restarts follows the current execution and those after it: leave out --execution")
    eid = args.execution
    if eid is None:
        eid, _ = _current_eid(ctx, xid, wid)
        if not eid:
            raise CliError(f"work unit {xid}/{wid} has no execution yet")
    what = f"execution {eid} of work unit {xid}/{wid}"
    path = f"/v1/experiments/{xid}/workUnits/{wid}/executions/{eid}/logs"
    if not args.follow:
        stream = Stream(ctx, path, _query(args, args.replica or "all"), what)
        if args.previous and stream.headers.get("X-XMC-Log-Source") == "none":
            stream.close()
            note = stream.headers.get("X-XMC-Log-Note", "")
            raise CliError(f"no previous instance of the container of {what}: "
                           + (note or "it has not restarted"))
        replicas = [r for r in stream.headers.get("X-XMC-Log-Replicas", "").split(",") if r]
        printer = Printer(ctx, as_json=args.json, timestamps=args.timestamps,
                          prefix=not args.replica and len(replicas) > 1)
        _note(ctx, stream.headers, args.json)
        printed = 0
        for record in stream.records():
            printer.line(record)
            printed += 1
        if not printed:
            _empty(ctx, args, stream.headers, what)
        return EXIT_OK
    seen = Seen()
    follower: Printer | None = None
    while True:
        started, follower = _follow_execution(ctx, args, xid, wid, eid, seen, follower)
        current, unit = _current_eid(ctx, xid, wid)
        if not args.follow_restarts:
            if not started:
                _say(ctx, args, f"{xid}/{wid} is {present.state_of(unit).lower()}: no pod of execution {eid} "
                                "started, so there is no log to follow.")
            elif not seen.count:
                _say(ctx, args, f"No log lines: the container of execution {eid} of {xid}/{wid} wrote nothing.")
            return EXIT_OK
        # --follow-restarts: on to the next execution, once there is one; done when the unit has ended.
        while current == eid and present.state_of(unit) not in present.TERMINAL:
            time.sleep(WAIT_FOR_POD_S)
            current, unit = _current_eid(ctx, xid, wid)
        if current == eid:
            if not seen.count:
                _say(ctx, args, f"No log lines: {xid}/{wid} is {present.state_of(unit).lower()} and wrote nothing.")
            return EXIT_OK
        _say(ctx, args, f"{xid}/{wid} restarted: following execution {current}.")
        eid = current


def _empty(ctx: Any, args: argparse.Namespace, headers: httpx.Headers, what: str) -> None:
    """An answer without a line is never silent: say why there is nothing."""
    if headers.get("X-XMC-Log-Source") == "none":
        return  # _note said "No logs yet" and why
    note = headers.get("X-XMC-Log-Note", "")
    if args.previous:
        _say(ctx, args, f"No log lines in the previous instance of the container of {what}"
                        + (f": {note}" if note else "."))
    elif note and _waiting(headers):
        _say(ctx, args, f"No log lines yet: {note}")
    else:
        _say(ctx, args, f"No log lines for {what}" + (" in this window (--tail / --since)."
                                                       if args.tail is not None or args.since is not None
                                                       else ": the container wrote nothing."))
