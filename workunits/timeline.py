"""An execution's states over time, drawn as an SVG picture by the server.

Used by the admin's work unit and execution pages (no JavaScript): one lane
per execution, one coloured band per state from the status history, labelled
with the state and its duration, with the start and end times under it. Pure
functions over plain rows, so the drawing is tested without a browser too.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape

from workunits.choices import TERMINAL, WorkUnitState

S = WorkUnitState

#: Band colours: pending states cool, running green, trouble warm, ends grey/red.
COLOURS: dict[str, str] = {
    S.INITIALIZING: "#b0bec5", S.RESTARTING: "#b0bec5", S.SCHEDULING: "#90caf9",
    S.SCHEDULING_PAUSED: "#ce93d8", S.STARTING: "#80deea", S.RUNNING: "#66bb6a",
    S.PARTIALLY_FAILED: "#ffb74d", S.STOPPING: "#ffe082", S.DESCHEDULING: "#90caf9",
    S.STOPPED: "#9e9e9e", S.COMPLETED: "#2e7d32", S.FAILED: "#e53935",
}
WIDTH, LANE, PAD = 760, 34, 8
#: Bands dark enough to need white text.
DARK = frozenset({S.COMPLETED, S.FAILED, S.STOPPED})
#: Width of the end cap that shows a terminal state (it has no duration).
CAP = 96
#: Approximate width of one character at the labels' font size.
CHAR = 7.0


#: What a band means when it comes back after the execution had run: a pod the Job tries again
#: (STARTING after RUNNING, the quota held) or a re-queue (SCHEDULING after it was admitted).
RETRY, REQUEUE = "pod retry", "re-queued"
_RAN = frozenset({S.STARTING, S.RUNNING, S.PARTIALLY_FAILED})


@dataclass(frozen=True)
class Segment:
    state: str
    start: datetime
    end: datetime
    #: `RETRY`, `REQUEUE` or "" (the first time in this state)
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.state} ({self.note})" if self.note else self.state

    @property
    def duration(self) -> timedelta:
        return self.end - self.start


def segments(history: Sequence[tuple[datetime, str]], end: datetime) -> list[Segment]:
    """Bands from ``(time, to_state)`` rows in time order; the last lasts until ``end``.

    A row that keeps the state (a status update within it: new scheduling
    information, a message) extends the band instead of starting one: one
    band per state the execution was in, not per update.
    """
    rows = sorted(history, key=lambda row: row[0])
    out: list[Segment] = []
    for i, (start, state) in enumerate(rows):
        stop = rows[i + 1][0] if i + 1 < len(rows) else max(end, start)
        if out and out[-1].state == state:
            out[-1] = Segment(state, out[-1].start, stop, out[-1].note)
            continue
        note = ""
        if out and out[-1].state == S.RUNNING and state == S.STARTING:
            note = RETRY
        elif state in (S.SCHEDULING, S.DESCHEDULING) and any(b.state in _RAN for b in out):
            note = REQUEUE
        out.append(Segment(state, start, stop, note))
    return out


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def svg(bands: Sequence[Segment], *, title: str, inline_style: bool = True) -> str:
    """One lane of bands as a standalone ``<svg>`` element (text escaped).

    ``inline_style=False`` leaves out the ``style`` attribute (max-width 100%) for
    pages whose Content-Security-Policy forbids inline styles; their stylesheet sizes
    ``.xmc-timeline`` instead (the researcher's pages, ``ui/static/ui/ui.css``).
    """
    height = LANE + 2 * PAD + 16
    style = ' style="max-width: 100%; height: auto"' if inline_style else ""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="xmc-timeline" role="img" '
             f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}"{style}>',
             f"<title>{escape(title)}</title>"]
    if not bands:
        parts.append(f'<text x="{PAD}" y="{PAD + 20}" font-size="12">no status history</text></svg>')
        return "".join(parts)
    start, end = bands[0].start, bands[-1].end
    total = max((end - start).total_seconds(), 1e-3)
    capped = bands[-1].state in TERMINAL and len(bands) > 1
    inner = WIDTH - 2 * PAD - (CAP if capped else 0)
    for i, band in enumerate(bands):
        if capped and i == len(bands) - 1:
            x, w, label = float(PAD + inner), float(CAP), band.label
        else:
            x = PAD + inner * (band.start - start).total_seconds() / total
            w = max(inner * band.duration.total_seconds() / total, 2.0)
            label = f"{band.label} {_duration(band.duration)}"
        note = f' data-note="{escape(band.note)}"' if band.note else ""
        parts.append(
            f'<g class="band" data-state="{escape(band.state)}"{note}>'
            f"<title>{escape(band.label)} {_duration(band.duration)} from {band.start:%Y-%m-%d %H:%M:%S} UTC</title>"
            f'<rect x="{x:.1f}" y="{PAD}" width="{w:.1f}" height="{LANE}" '
            f'fill="{COLOURS.get(band.state, "#bdbdbd")}" stroke="#fff" />'
        )
        for text in (label, band.label, band.state):
            if w > CHAR * len(text) + 8:
                parts.append(f'<text x="{x + 4:.1f}" y="{PAD + LANE / 2 + 4:.1f}" font-size="11" '
                             f'fill="{"#fff" if band.state in DARK else "#000"}">{escape(text)}</text>')
                break
        parts.append("</g>")
    axis_y = PAD + LANE + 14
    parts.append(f'<text x="{PAD}" y="{axis_y}" font-size="10">{start:%Y-%m-%d %H:%M:%S} UTC</text>')
    parts.append(f'<text x="{WIDTH - PAD}" y="{axis_y}" font-size="10" text-anchor="end">'
                 f"{end:%Y-%m-%d %H:%M:%S} UTC</text></svg>")
    return "".join(parts)


def legend(bands: Sequence[Segment]) -> str:
    """The bands as a list of words under the picture: colour, state (and `RETRY`/`REQUEUE`), duration,
    start time. Readable at any width: on a phone the picture is scaled to a third and its labels
    would be 4 px, so the pages hide them there (``ui/static/ui/ui.css``) and this list says it."""
    items = []
    for band in bands:
        swatch = (f'<svg class="swatch" width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
                  f'fill="{COLOURS.get(band.state, "#bdbdbd")}" /></svg>')
        took = "" if band.state in TERMINAL and band is bands[-1] else f" {_duration(band.duration)}"
        items.append(f'<li data-state="{escape(band.state)}">{swatch} {escape(band.label)}{took}'
                     f' <span class="muted">{band.start:%H:%M:%S}</span></li>')
    return f'<ol class="timeline-legend">{"".join(items)}</ol>' if items else ""
