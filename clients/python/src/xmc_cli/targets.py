"""Parsing what the researcher types: ``12``, ``12/3``, ``12/3,5``, ``12/3-5``, ``experiments/12/workUnits/3``, or a page URL."""
from __future__ import annotations

import re
from dataclasses import dataclass

from xmc_cli.errors import UsageError

_RESOURCE = re.compile(r"(?:^|/)experiments/(\d+)(?:/workUnits/(\d+))?/?$")
_SHORT = re.compile(r"^(\d+)(?:/([\d,\-]+))?$")
MAX_RANGE = 10_000


@dataclass(frozen=True)
class Target:
    xid: int
    wids: tuple[int, ...] = ()  # empty: the whole experiment

    def __str__(self) -> str:
        return f"{self.xid}" + (f"/{','.join(map(str, self.wids))}" if self.wids else "")


def _wids(text: str, original: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        if not part:
            raise UsageError(f"bad work unit list in {original!r}: empty item")
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UsageError(f"bad work unit list in {original!r}: {part!r} (expected 3, 3,5 or 3-5)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last - first > MAX_RANGE:
            raise UsageError(f"bad work unit range {part!r} in {original!r}")
        out.extend(w for w in range(first, last + 1) if w not in out)
    return tuple(out)


def parse(text: str, *, need_wid: bool = False, one_wid: bool = False) -> Target:
    raw = text.strip()
    path = raw.split("?", 1)[0].split("#", 1)[0]
    match = _RESOURCE.search(path) if "experiments/" in path else None
    if match:
        target = Target(int(match.group(1)), (int(match.group(2)),) if match.group(2) else ())
    else:
        short = _SHORT.match(raw)
        if not short:
            raise UsageError(f"bad target {text!r}: expected XID or XID/WID (e.g. 12 or 12/3)")
        target = Target(int(short.group(1)), _wids(short.group(2), raw) if short.group(2) else ())
    if target.xid <= 0 or any(w <= 0 for w in target.wids):
        raise UsageError(f"bad target {text!r}: ids start at 1")
    if need_wid and not target.wids:
        raise UsageError(f"{text!r} names no work unit: expected XID/WID (e.g. {target.xid}/1)")
    if one_wid and len(target.wids) > 1:
        raise UsageError(f"{text!r} names several work units: give one (e.g. {target.xid}/{target.wids[0]})")
    return target
