"""The work unit table's rows as HTML, built in Python: the one part of a page drawn outside a template.

Why: an experiment page of 1,000 work units spent ~90 % of its time in the
template engine (a dozen variable lookups and filters per row, times 1,000);
this builds the same markup with ``html.escape`` on every value in a tenth
of the time. Every value is escaped here exactly as the templates' autoescape
would; a link gets an ``href`` only from ``ui.present.links`` (http/https).
Called by ``ui.views`` for the page and for the one-row fragment an event
re-fetches; the markup is the ``#units`` table's (``ui/templates/ui/experiment.html``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

from ui import present


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _when(moment: datetime | None) -> tuple[str, str]:
    if moment is None:
        return "", ""
    return str(int(moment.timestamp())), moment.strftime("%b %-d, %H:%M")


def _links(links: Sequence[Mapping[str, str]]) -> str:
    parts = []
    for link in links:
        if link["href"]:
            parts.append(f'<a href="{_e(link["href"])}" rel="noopener noreferrer" target="_blank">'
                         f'{_e(link["name"])}</a>')
        else:
            parts.append(f'<span class="linkless">{_e(link["name"])}</span>')
    return "".join(parts)


def _truncate(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _chips(tags: Sequence[str]) -> str:
    return "".join(f'<span class="chip">{_e(tag)}</span>' for tag in tags)


def _metric_cells(row: Mapping[str, Any], metrics: Sequence[str], best: Mapping[str, float | None]) -> str:
    out = []
    for name in metrics:
        value = row["metrics"].get(name)
        top = value is not None and best.get(name) is not None and value == best[name]
        mark = ' best" title="best' if top else ""
        stored = "" if value is None else repr(value)
        out.append(f'<td class="num metric{mark}" data-metric="{_e(name)}" data-value="{stored}">'
                   f'{_e(present.number(value))}</td>')
    return "".join(out)


def unit_row(row: Mapping[str, Any], xid: int, can_write: bool, columns: Sequence[str],
             metrics: Sequence[str] = (), best: Mapping[str, float | None] | None = None) -> str:
    """One ``<tr>`` of the work unit table (htmx re-fetches it on the work unit's event).

    ``columns`` are the sweep's argument names: the re-fetch names them, so
    the server reads only this one work unit to draw its row again; ``metrics``
    are the metric columns and ``best`` their best values (marked), named too.
    """
    wid = int(row["wid"])
    best = best or {}
    cols = [*(("col", c) for c in columns), *(("m", m) for m in metrics),
            *(("b", f"{m}:{best[m]!r}") for m in metrics if best.get(m) is not None)]
    query = _e(urlencode([("fragment", "row"), ("wid", wid), *cols]))
    state = _e(row["state"])
    stamp, started = _when(row["started"])
    # Everyone selects (to compare); only writers get stop / restart with the selection.
    select = (f'<td><input type="checkbox" name="wid" value="{wid}" form="bulk" '
              f'aria-label="Select work unit {wid}"></td>')
    edit = (f'<button type="button" class="btn small edit" hx-get="/experiments/{xid}?'
            f'{_e(urlencode([("fragment", "edit"), ("wid", wid), *cols]))}" hx-target="closest tr" '
            f'hx-swap="outerHTML" aria-label="Edit the tags and notes of work unit {wid}">Edit</button>'
            ) if can_write else ""
    cells = "".join(f'<td class="arg">{_e(cell)}</td>' for cell in row["cells"])
    seconds = "" if row.get("seconds") is None else str(row["seconds"])
    return (
        f'<tr id="wu-{wid}" data-wid="{wid}" data-state="{state}" '
        f'hx-get="/experiments/{xid}?{query}" hx-trigger="sse:wu-{wid}" '
        f'hx-swap="outerHTML" hx-sync="this:replace">'
        f'{select}'
        f'<td class="num"><a href="/experiments/{xid}/workUnits/{wid}">{wid}</a></td>'
        f'<td data-value="{state}"><span class="badge s-{state}">{_e(row["words"])}</span></td>'
        f'<td class="num hide-sm">{_e(row["eid"])}</td>'
        f'<td class="job">{_e(row["job"])}</td>'
        f'{cells}{_metric_cells(row, metrics, best)}'
        f'<td class="why" data-reason="{_e(row.get("reason", ""))}">{_e(row["why"])}</td>'
        f'<td class="tags"><div class="chips">{_chips(row["tags"])}</div></td>'
        f'<td class="notes"><span class="note-text">{_e(_truncate(row["notes"], 120))}</span>{edit}</td>'
        f'<td class="last hide-sm">{_e(_truncate(row["last"]))}</td>'
        f'<td class="hide-sm" data-value="{stamp}">{_e(started)}</td>'
        f'<td class="num" data-value="{seconds}">{_e(row["duration"])}</td>'
        f'<td class="hide-sm"><div class="links">{_links(row["links"])}</div></td>'
        f'</tr>'
    )


def unit_rows(rows: Sequence[Mapping[str, Any]], xid: int, can_write: bool, columns: Sequence[str],
              metrics: Sequence[str] = (), best: Mapping[str, float | None] | None = None) -> str:
    return "\n".join(unit_row(row, xid, can_write, columns, metrics, best) for row in rows)
