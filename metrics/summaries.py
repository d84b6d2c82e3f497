"""Reads of the metric summaries (`metrics.models.MetricSummary`) for the sweep read.

The summaries are written by `metrics.services.write_points` only; this module reads them, never a
point: the experiment's metric names (`experiment_metrics`), the expression a queryset of work units
orders and filters by (`summary_value`: the current execution's value of one metric's stat), and the
summaries of a page of work units (`summaries_of`). Called by ``xmc.api.sweeps`` (the one read for a
sweep, behind REST, the pages and the CLI) and by the parameter importance.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import F, FilteredRelation, OuterRef, Q, Subquery

from metrics.models import MetricSummary

#: The stats a filter or order may name (``metrics.loss.last``), and what a row carries.
STATS = ("last", "min", "max")
#: Metric columns of one read at most (the default is every metric of the experiment, up to this).
MAX_METRICS = 50

_SUMMARIES = MetricSummary._meta.db_table

#: The experiment's distinct metric names, walking the ``(experiment, metric)`` index from one name to the
#: next: a loose index scan, one probe per metric however many work units have it.
_NAMES_SQL = f"""
WITH RECURSIVE names(metric) AS (
  (SELECT s.metric FROM {_SUMMARIES} s WHERE s.experiment_id = %s ORDER BY s.metric LIMIT 1)
  UNION ALL
  SELECT (SELECT s.metric FROM {_SUMMARIES} s WHERE s.experiment_id = %s AND s.metric > names.metric
          ORDER BY s.metric LIMIT 1)
  FROM names WHERE names.metric IS NOT NULL
)
SELECT metric FROM names WHERE metric IS NOT NULL LIMIT %s
"""


def experiment_metrics(xid: int, limit: int = MAX_METRICS) -> list[str]:
    """The names of the metrics any execution of experiment ``xid`` wrote, sorted, at most ``limit``."""
    with connection.cursor() as cursor:
        cursor.execute(_NAMES_SQL, [xid, xid, limit])
        return [row[0] for row in cursor.fetchall()]


def has_metric(xid: int, metric: str) -> bool:
    """Whether any execution of experiment ``xid`` wrote ``metric`` (one index probe)."""
    return MetricSummary.objects.filter(experiment_id=xid, metric=metric).exists()


def current_summary(metric: str) -> FilteredRelation:
    """The outer work unit's current execution's summary of ``metric``, as a LEFT JOIN of work units
    (annotate it, then read ``<alias>__last``): over a whole experiment Postgres joins the summaries
    of that metric in one pass (an index-only scan of ``(experiment, metric)`` covering the stats)
    rather than probing once per work unit."""
    return FilteredRelation("metric_summaries", condition=Q(
        metric_summaries__metric=metric, metric_summaries__eid=F("current_eid"),
        metric_summaries__experiment_id=F("experiment_id")))


def summary_value(metric: str, stat: str) -> Subquery:
    """The current execution's ``stat`` of ``metric`` for the outer work unit (NULL when it has none).

    One probe of the summaries' primary key (work unit, eid, metric) per work unit, so a queryset of
    work units can filter and order by it in the database.
    """
    if stat not in (*STATS, "last_step", "count"):
        raise ValueError(stat)
    return Subquery(MetricSummary.objects.filter(
        work_unit_id=OuterRef("pk"), eid=OuterRef("current_eid"), metric=metric).values(stat)[:1])


@dataclass(frozen=True)
class Stats:
    """One metric of one work unit's current execution, as a row of the sweep read carries it."""

    last: float
    last_step: int
    min: float
    max: float
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"last": self.last, "lastStep": self.last_step, "min": self.min, "max": self.max, "count": self.count}


def summaries_of(units: Iterable[tuple[int, int]], metrics: Sequence[str]) -> dict[int, dict[str, Stats]]:
    """``work unit pk -> {metric: Stats}`` of ``units`` ((pk, current eid) pairs) for ``metrics``; one query."""
    keys = list(units)
    if not keys or not metrics:
        return {}
    eids = dict(keys)
    out: dict[int, dict[str, Stats]] = {}
    rows = MetricSummary.objects.filter(work_unit_id__in=list(eids), metric__in=list(metrics)).values_list(
        "work_unit_id", "eid", "metric", "last", "last_step", "min", "max", "count")
    for unit, eid, metric, last, last_step, low, high, count in rows:
        if eids.get(unit) == eid:
            out.setdefault(unit, {})[metric] = Stats(last, last_step, low, high, count)
    return out
