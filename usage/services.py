"""Usage: GPU- and CPU-hours rolled up by owner, experiment or queue over a period (docs/architecture/usage.md).

Summed in one SQL statement over `usage.models.RunningInterval` (one row per
running interval of an execution, kept by the database's triggers at every
state change): each interval is clipped to the period, weighted by what the
execution was allocated, and -- for ``gpuHoursUsed`` -- by its mean
``system/gpu_utilization``: the settled mean of the interval's samples
(`settle`), or, while it is not settled yet, the mean of the execution's
samples so far (its coarsest `metrics.models.PointBlock`).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from core import inputs
from core.errors import InvalidArgument
from core.identity import Identity
from experiments.models import Experiment
from metrics.models import BLOCK_SIZES, MetricPoint, PointBlock
from metrics.system_names import GPU_UTILIZATION
from usage.models import RunningInterval

GROUP_BY = ("owner", "experiment", "queue")
#: The column each grouping sums by.
_KEY = {"owner": "u.owner", "experiment": "u.experiment_id", "queue": "u.queue"}
#: Rows one page holds at most / by default.
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
#: An interval is settled this long after it ended (the last utilisation samples have arrived).
SETTLE_AFTER = timedelta(minutes=2)
SETTLE_BATCH = 5000

_INTERVALS = RunningInterval._meta.db_table
_BLOCKS = PointBlock._meta.db_table
_POINTS = MetricPoint._meta.db_table


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime


@dataclass(frozen=True)
class UsageRow:
    key: str
    gpu_hours: float
    gpu_hours_used: float
    cpu_hours: float
    executions: int


@dataclass(frozen=True)
class Usage:
    group_by: str
    period: Period
    rows: list[UsageRow]
    total: UsageRow
    groups: int
    offset: int


def _sql(group_by: str, mine: bool) -> str:
    """One aggregation over the period's intervals, in double precision.

    An execution counts once, on its first interval in the period (``previous_end``: no earlier
    interval of it reaches into the period). Only unsettled intervals with GPUs read their
    execution's live utilisation (`PointBlock`): a CASE, so the lookup runs for those rows alone.

    Each interval's clipped hours are computed once (the inner select, kept apart from the
    aggregate by ``OFFSET 0``: flattened, the planner would evaluate them once per sum) and in
    ``date_part`` (double precision; ``extract`` computes in numeric, several times slower).
    """
    key = _KEY[group_by]
    owner = "AND u.owner = %(owner)s" if mine else ""
    return f"""
WITH g AS (
    SELECT i.key::text AS key,
           sum(i.gpus * i.hours) AS gpu_hours,
           sum(i.gpus * i.hours * i.used) AS gpu_hours_used,
           sum(i.cpu_millicores * i.hours) / 1000.0 AS cpu_hours,
           count(*) FILTER (WHERE i.first) AS executions
    FROM (
        SELECT {key} AS key, u.gpus, u.cpu_millicores,
               greatest(0.0, date_part('epoch', least(coalesce(u.end_time, %(now)s), %(end)s, %(now)s)
                                                - greatest(u.start_time, %(start)s)) / 3600.0) AS hours,
               least(1.0, greatest(0.0, CASE
                   WHEN u.gpus = 0 THEN 0.0
                   WHEN u.settled THEN coalesce(u.gpu_utilization, 0.0)
                   ELSE coalesce((SELECT sum(b.sum) / nullif(sum(b.count), 0) FROM {_BLOCKS} b
                       WHERE b.execution_id = u.execution_id AND b.metric = %(metric)s AND b.size = %(size)s), 0.0)
                   END)) AS used,
               (u.previous_end IS NULL OR u.previous_end <= %(start)s) AS first
        FROM {_INTERVALS} u
        WHERE u.start_time < %(end)s AND (u.end_time IS NULL OR u.end_time > %(start)s) {owner}
        OFFSET 0
    ) i
    GROUP BY i.key
)
SELECT key, gpu_hours, gpu_hours_used, cpu_hours, executions,
       count(*) OVER (), sum(gpu_hours) OVER (), sum(gpu_hours_used) OVER (), sum(cpu_hours) OVER (),
       sum(executions) OVER ()
FROM g
ORDER BY gpu_hours DESC, cpu_hours DESC, key
LIMIT %(limit)s OFFSET %(offset)s
"""


#: For the roll-up's one statement: its sums fit in memory (no sort spilled to disk), and compiling it
#: (JIT) costs more than it saves at this size.
_SETTINGS = "SET LOCAL work_mem = '64MB'; SET LOCAL jit = off"


def _rollup(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_SETTINGS)
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def usage(identity: Identity, group_by: str, period: Period, *, page_size: int = DEFAULT_PAGE_SIZE,
          offset: int = 0, now: datetime | None = None) -> Usage:
    """The usage of ``period`` grouped by ``group_by``, largest GPU-hours first.

    Staff see everyone's; anyone else only their own (the experiments they created).
    """
    if group_by not in GROUP_BY:
        raise InvalidArgument(f"groupBy must be one of {', '.join(GROUP_BY)} (got {group_by!r})", field="groupBy")
    if period.start >= period.end:
        raise InvalidArgument("startTime must be before endTime", field="startTime")
    params: dict[str, Any] = {
        "now": now or timezone.now(), "start": period.start, "end": period.end, "owner": identity.email,
        "metric": GPU_UTILIZATION, "size": BLOCK_SIZES[-1], "limit": page_size, "offset": offset,
    }
    fetched = _rollup(_sql(group_by, mine=not identity.is_staff), params)
    rows = [UsageRow(str(r[0]), float(r[1]), float(r[2]), float(r[3]), int(r[4])) for r in fetched]
    if fetched:
        first = fetched[0]
        groups = int(first[5])
        total = UsageRow("", float(first[6]), float(first[7]), float(first[8]), int(first[9]))
    else:
        groups, total = (0, UsageRow("", 0.0, 0.0, 0.0, 0)) if offset == 0 else _count(identity, group_by, period,
                                                                                       params)
    return Usage(group_by, period, rows, total, groups, offset)


def _count(identity: Identity, group_by: str, period: Period, params: dict[str, Any]) -> tuple[int, UsageRow]:
    """Groups and totals for a page past the end (the page itself is empty)."""
    rows = _rollup(_sql(group_by, mine=not identity.is_staff), {**params, "limit": 1, "offset": 0})
    row = rows[0] if rows else None
    if row is None:
        return 0, UsageRow("", 0.0, 0.0, 0.0, 0)
    return int(row[5]), UsageRow("", float(row[6]), float(row[7]), float(row[8]), int(row[9]))


_SETTLE = f"""
WITH due AS (
    SELECT id FROM {_INTERVALS}
    WHERE NOT settled AND end_time < %(cutoff)s
    ORDER BY end_time LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {_INTERVALS} u SET settled = true, gpu_utilization = CASE WHEN u.gpus > 0 THEN (
    SELECT avg(p.value) FROM {_POINTS} p
    WHERE p.execution_id = u.execution_id AND p.metric = %(metric)s
      AND p.time >= u.start_time AND p.time <= u.end_time) END
FROM due WHERE u.id = due.id
"""


def settle(*, now: datetime | None = None, batch: int = SETTLE_BATCH) -> int:
    """Store the mean GPU utilisation of intervals that ended at least `SETTLE_AFTER` ago; how many.

    Idempotent (a settled interval is never read again) and safe to run in
    several workers at once (``SKIP LOCKED``). The periodic task calls it.
    """
    cutoff = (now or timezone.now()) - SETTLE_AFTER
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_SETTLE, {"cutoff": cutoff, "batch": batch, "metric": GPU_UTILIZATION})
        return int(cursor.rowcount)


def experiment_titles(xids: list[int]) -> dict[int, str]:
    """xid -> title of those experiments (the page names its rows)."""
    return dict(Experiment.objects.filter(id__in=xids).values_list("id", "title"))


# --- The query both doors take (REST and the page) ---------------------------------------------

PARAMETERS = ("groupBy", "startTime", "endTime", "pageSize", "pageToken")
#: The default period: the last week.
DEFAULT_PERIOD = timedelta(days=7)
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})")


@dataclass(frozen=True)
class Query:
    group_by: str
    period: Period
    page_size: int
    offset: int


def parse_time(value: str, name: str) -> datetime:
    """An RFC 3339 time with its offset (``2026-01-02T03:04:05Z``); else InvalidArgument naming ``name``."""
    text = value.strip()
    if not _RFC3339.fullmatch(text):
        raise InvalidArgument(f"{name} must be an RFC 3339 time such as 2026-01-02T03:04:05Z (got {value[:64]!r})",
                              field=name)
    head, _, rest = text.partition(".")
    if rest:  # fromisoformat takes at most microseconds
        digits = re.match(r"[0-9]+", rest)
        assert digits is not None
        text = f"{head}.{(digits.group(0) + '000000')[:6]}{rest[digits.end():]}"
    try:
        return datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    except ValueError:
        raise InvalidArgument(f"{name} is not a valid date and time (got {value[:64]!r})", field=name) from None


def parse_query(params: Mapping[str, Sequence[str]], *, now: datetime | None = None) -> Query:
    """The usage query from request parameters; InvalidArgument names the first bad one."""
    for name, values in params.items():
        if name not in PARAMETERS:
            raise InvalidArgument(f"unknown parameter {name[:64]!r}; allowed: {', '.join(PARAMETERS)}", field=name)
        if len(values) > 1:
            raise InvalidArgument(f"{name} may be given once", field=name)

    def one(name: str) -> str:
        values = params.get(name) or [""]
        return values[0]

    group_by = one("groupBy") or "owner"
    if group_by not in GROUP_BY:
        raise InvalidArgument(f"groupBy must be one of {', '.join(GROUP_BY)} (got {group_by[:64]!r})", field="groupBy")
    now = now or timezone.now()
    end = parse_time(one("endTime"), "endTime") if one("endTime") else now
    start = parse_time(one("startTime"), "startTime") if one("startTime") else end - DEFAULT_PERIOD
    if start >= end:
        raise InvalidArgument("startTime must be before endTime", field="startTime")
    size_text = one("pageSize")
    page_size = DEFAULT_PAGE_SIZE
    if size_text:
        page_size = inputs.parse_int(size_text, "pageSize", low=1, high=MAX_PAGE_SIZE)
    token = one("pageToken")
    offset = inputs.parse_int(token, "pageToken", low=0, high=10**9) if token else 0
    return Query(group_by, Period(start, end), page_size, offset)


def usage_of(identity: Identity, query: Query, *, now: datetime | None = None) -> Usage:
    return usage(identity, query.group_by, query.period, page_size=query.page_size, offset=query.offset, now=now)


def next_page_token(result: Usage, page_size: int) -> str:
    following = result.offset + page_size
    return str(following) if following < result.groups else ""
