"""The daily partitions of the points table: created ahead, dropped whole by retention.

``metrics_metricpoint`` (`metrics.models.MetricPoint`) is partitioned by
RANGE on ``time``, one partition per UTC day named ``metrics_metricpoint_pYYYYMMDD``
(`partition_name`), plus a DEFAULT partition (``metrics_metricpoint_default``)
that takes any point whose day has no partition (a clock far off, an old
replay): a point is never refused for its time.

* `ensure_ahead` creates the partitions of today and the next
  ``XMC_METRICS_PARTITIONS_AHEAD_DAYS`` days that do not exist yet. It runs at
  migration time (``metrics/migrations/0002_partitioned_points.py``) and
  hourly from beat (`metrics.tasks.maintain_partitions`). A new partition is
  made as a plain table and then ATTACHed (a SHARE UPDATE EXCLUSIVE lock on the
  parent: writers and readers go on); points of its day already in the default
  partition move into it first, so the attach never fails.
* `drop_expired` drops every partition whose whole day is older than the
  retention (``DROP TABLE``: no row-by-row delete, no bloat, no vacuum), and
  deletes the default partition's old points (few: only strays land there);
  `delete_expired_blocks` deletes the `metrics.models.PointBlock` rows all of
  whose points are older (a row per 16 points or fewer, found by the BRIN
  index on their latest time).
* `delete_future` deletes points later than ``XMC_METRICS_MAX_FUTURE_S``
  ahead (the write path refuses them; older versions stored them where the
  cutoff never reached), so retention covers every stored row.

Both take ``lock_timeout`` so a long reader never queues the write path behind
a DDL lock; a timed-out run is retried by the next beat.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from django.db import connection, transaction

from metrics.models import BLOCK_SIZES, MetricPoint, PendingBlock, PointBlock, PointSpan
from metrics.services import floor_div_sql

PARENT = MetricPoint._meta.db_table
BLOCKS = PointBlock._meta.db_table
PENDING = PendingBlock._meta.db_table
SPANS = PointSpan._meta.db_table
DEFAULT = f"{PARENT}_default"
_DAILY = re.compile(rf"{PARENT}_p([0-9]{{8}})")
#: How long a partition DDL waits for its lock before giving up until the next run.
LOCK_TIMEOUT = "5s"
#: The advisory lock two maintainers (two beats, a migration beside a beat) take turns on ("XMCPARTS").
MAINTENANCE_LOCK_KEY = 0x584D435041525453


def partition_name(day: date) -> str:
    return f"{PARENT}_p{day:%Y%m%d}"


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=timezone.utc)


@dataclass(frozen=True)
class Maintenance:
    """What one `maintain` run did."""

    created: list[str]
    dropped: list[str]
    default_deleted: int
    blocks_deleted: int
    future_deleted: int = 0


def existing_days(cursor: Any = None) -> list[date]:
    """The days that have a partition, oldest first."""
    def run(cur: Any) -> list[date]:
        cur.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "WHERE i.inhparent = %s::regclass", [PARENT])
        days = []
        for (name,) in cur.fetchall():
            match = _DAILY.fullmatch(name)
            if match is not None:
                days.append(datetime.strptime(match.group(1), "%Y%m%d").date())
        return sorted(days)

    if cursor is not None:
        return run(cursor)
    with connection.cursor() as cur:
        return run(cur)


def create_day(cursor: Any, day: date) -> str:
    """Create and attach the partition of ``day`` (in the caller's transaction); returns its name."""
    name = partition_name(day)
    low, high = day_start(day), day_start(day + timedelta(days=1))
    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    cursor.execute(f"CREATE TABLE {name} (LIKE {PARENT} INCLUDING DEFAULTS)")
    # The bound as a CHECK first: ATTACH then need not scan the table to prove it.
    cursor.execute(f"ALTER TABLE {name} ADD CONSTRAINT {name}_bound CHECK (time >= %s AND time < %s)", [low, high])
    # Points of this day that arrived before its partition sit in the default one: move them.
    cursor.execute(f"WITH moved AS (DELETE FROM {DEFAULT} WHERE time >= %s AND time < %s RETURNING *) "
                   f"INSERT INTO {name} SELECT * FROM moved", [low, high])
    cursor.execute(f"ALTER TABLE {PARENT} ATTACH PARTITION {name} FOR VALUES FROM (%s) TO (%s)", [low, high])
    cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_bound")
    return name


def ensure_ahead(today: date, days_ahead: int) -> list[str]:
    """Create the missing partitions of ``today`` .. ``today + days_ahead``, one transaction each."""
    have = set(existing_days())
    created = []
    for offset in range(days_ahead + 1):
        day = today + timedelta(days=offset)
        if day in have:
            continue
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [MAINTENANCE_LOCK_KEY])
            cursor.execute("SELECT to_regclass(%s)", [partition_name(day)])
            if cursor.fetchone()[0] is None:  # not made by another maintainer meanwhile
                created.append(create_day(cursor, day))
    return created


def drop_expired(cutoff: datetime) -> tuple[list[str], int]:
    """Drop the partitions wholly before ``cutoff``; delete the default partition's points before it."""
    dropped = []
    for day in existing_days():
        if day_start(day + timedelta(days=1)) > cutoff:
            break
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [MAINTENANCE_LOCK_KEY])
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cursor.execute(f"DROP TABLE IF EXISTS {partition_name(day)}")
        dropped.append(partition_name(day))
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {DEFAULT} WHERE time < %s", [cutoff])
        deleted = int(cursor.rowcount)
    return dropped, deleted


def delete_expired_blocks(cutoff: datetime, *, batch: int = 10_000) -> int:
    """Delete the `PointBlock` rows whose every point is older than ``cutoff`` (their latest time is),
    in short transactions; a block that also holds newer points stays whole."""
    total = 0
    while True:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {BLOCKS} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {BLOCKS} "
                           "WHERE last_time < %s LIMIT %s))", [cutoff, batch])
            deleted = int(cursor.rowcount)
        total += deleted
        if deleted < batch:
            return total


_FUTURE_SPANS = (f"SELECT execution_id FROM {SPANS} WHERE last_time > %s ORDER BY execution_id "
                 "FOR UPDATE")
_REBUILD_BLOCKS = (
    f"INSERT INTO {BLOCKS} (execution_id, metric, size, block, count, sum, min, max, last_step, last_time) "
    f"SELECT p.execution_id, p.metric, z.size, {floor_div_sql('p.step', 'z.size')}, count(*), sum(p.value), "
    "min(p.value), max(p.value), max(p.step), max(p.time) "
    f"FROM {PARENT} p CROSS JOIN unnest(%(sizes)s::bigint[]) AS z(size) "
    "WHERE p.execution_id = %(execution)s AND p.metric = %(metric)s GROUP BY 1, 2, 3, 4"
)
_SHRINK_SPAN = (
    f"UPDATE {SPANS} s SET first_time = coalesce(r.first, least(s.first_time, %(limit)s)), "
    "last_time = coalesce(r.last, least(s.first_time, %(limit)s)) "
    f"FROM (SELECT min(time) AS first, max(time) AS last FROM {PARENT} WHERE execution_id = %(execution)s) r "
    "WHERE s.execution_id = %(execution)s"
)


def delete_future(limit: datetime, today: date, days_ahead: int) -> int:
    """Delete the points later than ``limit`` (written before times were bounded, or by a clock far off);
    returns how many.

    The write path refuses them now (``XMC_METRICS_MAX_FUTURE_S``,
    `xmc.api.metrics_write.parse_points`), but one stored from year 9999 sat
    in the DEFAULT partition (or a far daily one) where the retention cutoff
    never reached it. One transaction: the executions' `PointSpan` rows are
    locked first, in id order, as a writer locks them, so no write of theirs
    runs in between; their points after ``limit`` go, the `PointBlock` rows
    of each (execution, metric) that held such a point are rebuilt from the
    points left, and the span shrinks to them. Daily partitions past both
    ``limit`` and the days made ahead, now empty, are dropped.
    """
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(_FUTURE_SPANS, [limit])
        executions = [int(row[0]) for row in cursor.fetchall()]
        deleted = 0
        if executions:
            cursor.execute(f"SELECT DISTINCT execution_id, metric FROM {BLOCKS} WHERE execution_id = ANY(%s) "
                           "AND last_time > %s", [executions, limit])
            stale = cursor.fetchall()
            cursor.execute(f"DELETE FROM {PARENT} WHERE execution_id = ANY(%s) AND time > %s", [executions, limit])
            deleted = int(cursor.rowcount)
            for execution, metric in stale:
                for table in (BLOCKS, PENDING):
                    cursor.execute(f"DELETE FROM {table} WHERE execution_id = %s AND metric = %s", [execution, metric])
                cursor.execute(_REBUILD_BLOCKS, {"execution": execution, "metric": metric, "sizes": list(BLOCK_SIZES)})
            for execution in executions:
                cursor.execute(_SHRINK_SPAN, {"execution": execution, "limit": limit})
    last_ahead = day_start(today + timedelta(days=days_ahead + 1))
    for day in existing_days():
        if day_start(day) > limit and day_start(day) >= last_ahead:
            with transaction.atomic(durable=True), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [MAINTENANCE_LOCK_KEY])
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {partition_name(day)})")
                if not cursor.fetchone()[0]:
                    cursor.execute(f"DROP TABLE IF EXISTS {partition_name(day)}")
    return deleted


def maintain(now: datetime, *, days_ahead: int, retention_days: int, max_future_s: int) -> Maintenance:
    """Partitions ahead of ``now``; points past ``now + max_future_s`` deleted; with a retention
    (> 0 days), the expired ones dropped."""
    today = now.astimezone(timezone.utc).date()
    created = ensure_ahead(today, days_ahead)
    future = delete_future(now + timedelta(seconds=max_future_s), today, days_ahead)
    if retention_days <= 0:
        return Maintenance(created, [], 0, 0, future)
    cutoff = now - timedelta(days=retention_days)
    dropped, deleted = drop_expired(cutoff)
    return Maintenance(created, dropped, deleted, delete_expired_blocks(cutoff), future)
