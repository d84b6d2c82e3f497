"""The estimated start of a queued work unit, and whether to show it (issue 38, item 5).

One owner for the pages (``ui.views``), the headlines read (``workunits.headline.for_experiment``:
``xmc why`` and ``xmc status``) and the benchmark that measures it (``bench/eta.py``).
The estimate comes from the queue's recent admissions (`recent_admissions`,
`estimate_start`); it is shown only while the method's median absolute error,
measured by ``bench/eta.py`` against the simulator (`ESTIMATE_MEASURED_ERROR`),
is within `ESTIMATE_MAX_ERROR` of the real wait (`shown`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from workunits.choices import WorkUnitState
from workunits.models import StatusHistory

#: The bar an estimate must clear to be shown: median absolute error / real wait.
ESTIMATE_MAX_ERROR = 0.25
#: What ``bench/eta.py`` measured for `estimate_start` (README, "Estimated start": 29 %, 2026-12-04);
#: update it with each run. Over the bar: no estimate is shown.
ESTIMATE_MEASURED_ERROR = 0.29


def shown() -> bool:
    """Whether the pages and ``xmc why`` show an estimate at all (the method cleared the bar)."""
    return ESTIMATE_MEASURED_ERROR <= ESTIMATE_MAX_ERROR


#: Admissions the estimate of a start needs at least, and how far back it looks.
ESTIMATE_MIN_ADMISSIONS = 8
ESTIMATE_WINDOW_S = 6 * 3600
#: A queue that has admitted nothing for this many of its usual gaps has stalled: no estimate.
ESTIMATE_STALLED_GAPS = 5.0
#: z for the central 80 % of a normal: the range printed.
_Z80 = 1.2816


def estimate_start(position: int, admissions: Sequence[datetime], now: datetime) -> tuple[float, float] | None:
    """A range (seconds from ``now``) for when the workload at ``position`` is admitted, or None.

    From the queue's recent admissions (``admissions``: their times, any
    order): the gaps between consecutive ones are taken as independent draws
    of one distribution (mean ``m``, standard deviation ``s``), so the wait for
    ``position`` more admissions is their sum, ``position * m`` give or take
    ``z80 * s * sqrt(position)`` (the central 80 %), counted from the last
    admission. None -- no estimate rather than a guess -- with fewer than
    `ESTIMATE_MIN_ADMISSIONS` in the last `ESTIMATE_WINDOW_S`, or when
    nothing has been admitted for `ESTIMATE_STALLED_GAPS` usual gaps (the
    queue has stalled: full, paused, or a blocked head).
    """
    recent = sorted(t for t in admissions if (now - t).total_seconds() <= ESTIMATE_WINDOW_S)
    if position < 1 or len(recent) < ESTIMATE_MIN_ADMISSIONS:
        return None
    gaps = [(b - a).total_seconds() for a, b in zip(recent, recent[1:])]
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return None
    spread = (sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1)) ** 0.5 if len(gaps) > 1 else 0.0
    since_last = max(0.0, (now - recent[-1]).total_seconds())
    if since_last > ESTIMATE_STALLED_GAPS * mean:
        return None
    centre = position * mean - since_last
    half = _Z80 * spread * position ** 0.5
    return max(0.0, centre - half), max(0.0, centre + half, mean / 2)


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def estimate_words(estimate: tuple[float, float] | None, admissions: int) -> str:
    """``Estimated start in 2 min to 6 min (from the queue's last 24 admissions)``; "" for None."""
    if estimate is None:
        return ""
    low, high = _span(estimate[0]), _span(estimate[1])
    when = f"within {high}" if estimate[0] < 1 or low == high else f"in {low} to {high}"
    return f"Estimated start {when} (from the queue's last {admissions} admissions)"


def queue_position(current: Mapping[str, Any]) -> int | None:
    queue = (((current.get("scheduling_information") or {}).get("auxiliaryInfo") or {}).get("queueInfo") or {})
    position = queue.get("positionInQueue")
    return int(position) if isinstance(position, (int, float)) and position >= 1 else None


#: Admissions one queue's estimate reads at most (the newest).
ADMISSIONS_READ = 50
#: Where an admitted unit goes from SCHEDULING (RUNNING when the cluster reported both at once).
ADMITTED = (WorkUnitState.STARTING, WorkUnitState.RUNNING)


def recent_admissions(queues: Sequence[str], window_s: float) -> dict[str, list[datetime]]:
    """Per queue name: when its work units were admitted (left SCHEDULING) in the last ``window_s``.

    The newest `ADMISSIONS_READ` per queue, from the status history (the
    partial index ``history_admission_time_idx``). The queue is the LocalQueue
    the work unit names (``schedulingConstraints.queueName``).
    """
    since = timezone.now() - timedelta(seconds=window_s)
    out: dict[str, list[datetime]] = {}
    for queue in sorted({q for q in queues if q}):
        rows = (StatusHistory.objects
                .filter(from_state=WorkUnitState.SCHEDULING, to_state__in=ADMITTED, time__gte=since,
                        execution__work_unit__executable__schedulingConstraints__queueName=queue)
                .order_by("-time").values_list("time", flat=True)[:ADMISSIONS_READ])
        out[queue] = list(rows)
    return out




def estimate_for(state: str, current: Mapping[str, Any], queue: str, admissions: Mapping[str, Sequence[datetime]],
                 now: datetime) -> str:
    """The words for a queued unit (``Estimated start in ...``), or "" (not queued with a position,
    no estimate, or the method has not cleared `ESTIMATE_MAX_ERROR`: `shown`)."""
    position = queue_position(current)
    if not shown() or state != "SCHEDULING" or position is None or queue not in admissions:
        return ""
    got = admissions[queue]
    return estimate_words(estimate_start(position, got, now), len(got))
