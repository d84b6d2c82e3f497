"""``xmc watch XID``: a live table until the experiment finishes; the exit code tells how.

Changes arrive as the researcher pages' server-sent events
(``GET /experiments/<xid>/events``: ``event: wu-<wid>``, ``wu-created``,
``experiment``, ``reload``); each one makes the command read the experiment
and its work units again over REST. When the events are not available (an
older server, a proxy that buffers, a server that takes only signed-in
browsers there) it polls every ``--interval`` seconds. It ends when every
work unit has reached COMPLETED, FAILED or STOPPED and the launch is over:
exit 0 when all completed, 1 when any failed, 3 when some were stopped and
none failed.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from rich.live import Live

from xmc_cli import auth, present, render, safe
from xmc_cli.errors import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, CliError
from xmc_cli.targets import parse

LIVE_SAFETY_POLL_S = 15.0  # with events, still re-read now and then (a missed event costs at most this)


class Events(threading.Thread):
    """Reads the SSE stream in the background and sets ``wake`` on every event."""

    def __init__(self, url: str, token: str, wake: threading.Event) -> None:
        super().__init__(daemon=True, name="xmc-watch-events")
        self.url, self.token, self.wake = url, token, wake
        self.live = False
        self.unsupported = ""
        self.stopping = False
        self.last_id = ""

    def run(self) -> None:
        failures = 0
        while not self.stopping and failures < 5:
            try:
                self._stream()
                failures = 0 if self.live else failures + 1
            except httpx.HTTPError:
                failures += 1
            self.live = False
            if self.unsupported:
                return
            time.sleep(min(2.0 * (failures + 1), 10.0))

    def _stream(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream", "Cache-Control": "no-store"}
        if self.last_id:
            headers["Last-Event-ID"] = self.last_id
        timeout = httpx.Timeout(connect=10.0, read=120.0, write=10.0, pool=10.0)
        with httpx.stream("GET", self.url, headers=headers, timeout=timeout, follow_redirects=False) as response:
            kind = response.headers.get("content-type", "")
            if response.status_code != 200 or not kind.startswith("text/event-stream"):
                self.unsupported = f"HTTP {response.status_code} {kind.split(';')[0]}".strip()
                return
            self.live = True
            self.wake.set()  # re-read once: anything between the first read and the stream opening
            for line in response.iter_lines():
                if self.stopping:
                    return
                if line.startswith("id:"):
                    self.last_id = line[3:].strip()
                elif line.startswith("event:"):
                    self.wake.set()


def finished(experiment: Mapping[str, Any], units: Sequence[Mapping[str, Any]]) -> int | None:
    """The exit code once the experiment is over, else None."""
    launch = str((experiment.get("status") or {}).get("launchState") or "")
    if launch == "LAUNCHING":
        return None
    states = [present.state_of(u) for u in units]
    if not states:
        return EXIT_FAILED if launch == "FAILED" else (EXIT_OK if launch == "COMPLETED" else None)
    if any(s not in present.TERMINAL for s in states):
        return None
    if any(s in present.FAILED_STATES for s in states):
        return EXIT_FAILED
    return EXIT_STOPPED if any(s == "STOPPED" for s in states) else EXIT_OK


def _states(units: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    return {present.last_id(u.get("name", "")): present.state_of(u) for u in units}


def cmd_watch(ctx: Any, args: argparse.Namespace) -> int:
    target = parse(args.target)
    if target.wids:
        raise CliError("watch takes an experiment (XID): it watches all its work units")
    xid = target.xid
    api = ctx.api
    wake = threading.Event()
    events: Events | None = None
    if not args.no_events:
        url = auth.ui_base(ctx.env, api.ident.origin) + f"/experiments/{xid}/events"
        events = Events(url, api.ident.token, wake)
    experiment = api.experiment(xid)  # not found before anything else
    units = api.work_units(xid)
    if events is not None:
        events.start()
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    interactive = ctx.out.is_terminal and not args.json
    previous: dict[int, str] = {}
    live = Live(render.status_view(experiment, units, ctx.out), console=ctx.out, auto_refresh=False, transient=False) \
        if interactive else None

    def emit_changes() -> None:
        current = _states(units)
        for wid, state in sorted(current.items()):
            if previous.get(wid) == state:
                continue
            if args.json:
                ctx.out.file.write(json.dumps({"event": "state", "xid": xid, "wid": wid, "state": state,
                                               "previous": previous.get(wid)}) + "\n")
                ctx.out.file.flush()
            elif not interactive:
                before = previous.get(wid)
                ctx.out.print(safe.plain(f"{xid}/{wid} " + (f"{before.lower()} → " if before else "") + state.lower()),
                              highlight=False)
        previous.clear()
        previous.update(current)

    try:
        if live is not None:
            live.start(refresh=True)
        while True:
            emit_changes()
            if live is not None:
                live.update(render.status_view(experiment, units, ctx.out), refresh=True)
            code = finished(experiment, units)
            if code is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise CliError(f"experiment {xid} still running after {args.timeout:g} s")
            wait = LIVE_SAFETY_POLL_S if events is not None and events.live else args.interval
            if deadline is not None:
                wait = max(0.05, min(wait, deadline - time.monotonic()))
            wake.wait(max(0.05, wait))
            wake.clear()
            experiment = api.experiment(xid)
            units = api.work_units(xid)
    finally:
        if live is not None:
            live.stop()
        if events is not None:
            events.stopping = True
    counts: dict[str, int] = {}
    for state in _states(units).values():
        counts[state] = counts.get(state, 0) + 1
    if args.json:
        ctx.out.file.write(json.dumps({"event": "finished", "xid": xid, "exitCode": code, "stateCounts": counts,
                                       "events": bool(events and (events.live or events.last_id))}) + "\n")
        ctx.out.file.flush()
    else:
        words = {EXIT_OK: "all completed", EXIT_FAILED: "some failed", EXIT_STOPPED: "stopped, none failed"}[code]
        ctx.err.print(f"Experiment {xid} finished: {words} ({present.rollup_text(counts)})", highlight=False)
    return code
