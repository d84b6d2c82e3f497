"""The estimated start of a queued work unit, from its queue's recent admissions (docs/architecture/ui.md).

Read by the pages (``ui.present`` / ``ui.reads`` re-export these names) and by
the queues view of ``k8s_bridge.queues``: `recent_admissions` reads when a
queue's work units left SCHEDULING (the status history), `estimate_start`
turns those times and a position into a range.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.utils import timezone

from core.choices import WorkUnitState
from workunits.models import StatusHistory

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


