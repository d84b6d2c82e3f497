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

Both take ``lock_timeout`` so a long reader never queues the write path behind
a DDL lock; a timed-out run is retried by the next beat.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from django.db import connection, transaction

from metrics.models import MetricPoint, PointBlock

PARENT = MetricPoint._meta.db_table
BLOCKS = PointBlock._meta.db_table
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


def maintain(now: datetime, *, days_ahead: int, retention_days: int) -> Maintenance:
    """Partitions ahead of ``now``; with a retention (> 0 days), the expired ones dropped."""
    created = ensure_ahead(now.astimezone(timezone.utc).date(), days_ahead)
    if retention_days <= 0:
        return Maintenance(created, [], 0, 0)
    cutoff = now - timedelta(days=retention_days)
    dropped, deleted = drop_expired(cutoff)
    return Maintenance(created, dropped, deleted, delete_expired_blocks(cutoff))
