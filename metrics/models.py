"""Dashboards, charts and metric points.

* `Chart`: plot specs over one work unit's metrics (``cloud.xmanager.v1.Chart``),
  named ``experiments/{xid}/workUnits/{wid}/charts/{chart_id}``; its access is
  its experiment's.
* `Dashboard`: an ordered list of charts (`DashboardChart`) owned by one user.
* `MetricPoint`: one (execution, metric, step) value -- the narrow table the
  write path fills (`metrics.services.write_points`) and GetChartData reads
  (`metrics.data`). In Postgres it is partitioned by RANGE on ``time``, one
  partition a day (`metrics.partitions`; the DDL is
  ``metrics/migrations/0002_partitioned_points.py``). A unique constraint of a
  partitioned table must include the partition key, so its primary key is
  (execution, metric, step, time) -- also the b-tree every chart query walks --
  and the write path keeps (execution, metric, step) unique itself: a replayed
  batch does not double points.
* `PointBlock`: the count, sum, min and max of one execution's points of one
  metric over a block of ``size`` consecutive steps, for sizes 16, 32, 64, ...
  (`BLOCK_SIZES`); kept by the write path in the same statement as the points,
  read by GetChartData when a pixel holds many points (`metrics.data`).
* `PointSpan`: the earliest and latest time and the highest step of one
  execution's points, kept by the write path: where duplicates and a chart's
  points can be (the partitions to look in, whether a batch can repeat any).

Rows are written only through `metrics.services`.
"""
from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models

from core import limits

#: A client-chosen chart or dashboard id (server-chosen ones are UUIDs, which match too).
ID_LENGTH = 63
#: A metric name ("val/loss").
METRIC_NAME = 256


class Dashboard(models.Model):
    #: Unique per owner (``dashboard_id_per_owner``): no one can take or probe another's id.
    dashboard_id = models.CharField(max_length=ID_LENGTH, db_index=True)
    title = models.CharField(max_length=limits.TITLE)
    description = models.TextField(blank=True, default="")
    owner = models.CharField(max_length=limits.EMAIL, db_index=True)
    #: ``LayoutSpec`` as proto3 JSON.
    chart_layout = models.JSONField(default=dict, blank=True)
    #: ``XidAcls`` as proto3 JSON: who else may read (readers) or change (writers, owners) it.
    acls = models.JSONField(default=dict, blank=True)
    create_time = models.DateTimeField()
    update_time = models.DateTimeField()
    charts: models.ManyToManyField[Chart, DashboardChart] = models.ManyToManyField(
        "Chart", through="DashboardChart", related_name="dashboards")

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["owner", "dashboard_id"], name="dashboard_id_per_owner")]

    def __str__(self) -> str:
        return f"dashboards/{self.dashboard_id}"

    @property
    def name(self) -> str:
        return f"dashboards/{self.dashboard_id}"


class Chart(models.Model):
    #: Unique per work unit (``chart_id_per_work_unit``), as its name says.
    chart_id = models.CharField(max_length=ID_LENGTH, db_index=True)
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="charts")
    work_unit = models.ForeignKey("workunits.WorkUnit", on_delete=models.CASCADE, related_name="charts")
    title = models.CharField(max_length=limits.TITLE)
    description = models.TextField(blank=True, default="")
    #: ``repeated PlotSpec`` as a list of proto3 JSON objects.
    plots = models.JSONField(default=list)
    #: ``LayoutSpec`` as proto3 JSON.
    plot_layout = models.JSONField(default=dict, blank=True)
    creator = models.CharField(max_length=limits.EMAIL)
    create_time = models.DateTimeField()
    update_time = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["work_unit", "chart_id"], name="chart_id_per_work_unit")]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        return f"experiments/{self.experiment_id}/workUnits/{self.work_unit.wid}/charts/{self.chart_id}"


class DashboardChart(models.Model):
    dashboard = models.ForeignKey(Dashboard, on_delete=models.CASCADE)
    chart = models.ForeignKey(Chart, on_delete=models.CASCADE)
    position = models.IntegerField()

    class Meta:
        ordering = ["dashboard", "position"]
        constraints = [
            models.UniqueConstraint(fields=["dashboard", "chart"], name="dashboard_chart_once"),
        ]


class MetricPoint(models.Model):
    """One value of one metric at one step of one execution (narrow: no id, no text but the metric).

    The table is created by raw SQL in its migration (partitioned by ``time``);
    this model is its state for the ORM and must stay equal to it (``./dev test``
    checks models and migrations agree).
    """

    # The b-tree every chart query walks (execution, metric, step order); the
    # partition key ``time`` is in it because Postgres requires it.
    pk = models.CompositePrimaryKey("execution", "metric", "step", "time")
    # No database constraint: its check is a query per inserted row at commit (a third of the write's
    # time). The write path resolves the execution in the same request, and a deleted execution's points
    # go with it through Django's CASCADE.
    execution = models.ForeignKey("workunits.WorkUnitExecution", on_delete=models.CASCADE,
                                  related_name="metric_points", db_index=False, db_constraint=False)
    metric = models.CharField(max_length=METRIC_NAME)
    step = models.BigIntegerField()
    value = models.FloatField()
    time = models.DateTimeField()

    class Meta:
        indexes = [BrinIndex(fields=["time"], name="metric_point_time_brin")]


class PointSpan(models.Model):
    """Where one execution's points are: their earliest and latest time and their highest step.

    Written in the same transaction as the points (`metrics.services.write_points`, which locks the
    row to serialize the writers of one execution); it may be wider than the points (after retention
    dropped some), never narrower.
    """

    execution = models.OneToOneField("workunits.WorkUnitExecution", on_delete=models.CASCADE, primary_key=True,
                                     related_name="point_span")
    first_time = models.DateTimeField()
    last_time = models.DateTimeField()
    last_step = models.BigIntegerField()


#: The step blocks `PointBlock` keeps, finest first (16, 32, ... 2**34 steps): a chart whose pixel spans
#: more than a few steps reads one block a bucket, of the smallest size at least as wide as its pixel,
#: instead of every point (`metrics.data.block_size`).
BLOCK_SIZES = tuple(16 * 2**k for k in range(31))
#: The sizes `metrics.services.write_points_many` (the system metrics' collector) keeps in its write: the
#: finest (metric names, fine zooms) and the coarsest (a series' whole mean: `usage`). The sizes between
#: are rolled up from `PendingBlock` rows later (`metrics.services.roll_up_blocks`): by a periodic pass,
#: and by any chart read at those sizes first, so a read sees every point written before it.
EAGER_BLOCK_SIZES = (BLOCK_SIZES[0], BLOCK_SIZES[-1])
LAZY_BLOCK_SIZES = BLOCK_SIZES[1:-1]


class PointBlock(models.Model):
    """Points ``block * size`` .. ``block * size + size - 1`` (by step) of one metric of one execution, summed up."""

    pk = models.CompositePrimaryKey("execution", "metric", "size", "block")
    execution = models.ForeignKey("workunits.WorkUnitExecution", on_delete=models.CASCADE,
                                  related_name="point_blocks", db_index=False, db_constraint=False)
    metric = models.CharField(max_length=METRIC_NAME)
    size = models.BigIntegerField()
    block = models.BigIntegerField()
    count = models.BigIntegerField()
    sum = models.FloatField()
    min = models.FloatField()
    max = models.FloatField()
    #: The highest step and the latest time in the block (what a bucket of it reports; retention's key).
    last_step = models.BigIntegerField()
    last_time = models.DateTimeField()

    class Meta:
        indexes = [BrinIndex(fields=["last_time"], name="metric_block_time_brin")]


class PendingBlock(models.Model):
    """Points of one finest block (`BLOCK_SIZES` [0]) already in its `PointBlock` of that size (and of the
    coarsest) but not yet in the blocks of `LAZY_BLOCK_SIZES`: what `metrics.services.roll_up_blocks`
    adds to them (and deletes, in the same statement). Written by `metrics.services.write_points_many`."""

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey("workunits.WorkUnitExecution", on_delete=models.CASCADE,
                                  related_name="pending_blocks", db_index=False, db_constraint=False)
    metric = models.CharField(max_length=METRIC_NAME)
    block = models.BigIntegerField()
    count = models.BigIntegerField()
    sum = models.FloatField()
    min = models.FloatField()
    max = models.FloatField()
    last_step = models.BigIntegerField()
    last_time = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["execution", "metric"], name="metric_pending_block_idx")]


class MetricSummary(models.Model):
    """One metric of one execution, summed up: its last value (at the highest step) and that step, its
    min, max and count, its first and last time.

    Kept by the write path in the same statement as the points (`metrics.services.write_points`: one
    upsert per metric of a batch, GREATEST/LEAST, never a scan of the points), so the sweep read
    (`metrics.sweeps`) orders and filters work units by their metrics without reading a point. Keyed
    by (work unit, eid, metric): a work unit's summary is its current execution's (``eid =
    current_eid``), which the read joins on this key. ``experiment`` is there for the experiment's
    metric names (a loose index scan of ``(experiment, metric)``). Retention drops points, not
    summaries: a summary is of every point ever written.
    """

    pk = models.CompositePrimaryKey("work_unit", "eid", "metric")
    work_unit = models.ForeignKey("workunits.WorkUnit", on_delete=models.CASCADE, related_name="metric_summaries",
                                  db_index=False, db_constraint=False)
    eid = models.BigIntegerField()
    metric = models.CharField(max_length=METRIC_NAME)
    # No database constraints (as the points): the write path resolves the execution in the same request;
    # deleting a work unit (or its experiment) deletes its summaries through Django's CASCADE (executions
    # are never deleted alone).
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE,
                                   related_name="metric_summaries", db_index=False, db_constraint=False)
    last = models.FloatField()
    last_step = models.BigIntegerField()
    min = models.FloatField()
    max = models.FloatField()
    count = models.BigIntegerField()
    first_time = models.DateTimeField()
    last_time = models.DateTimeField()

    class Meta:
        # The experiment's metric names (a loose index scan) and, covering the stats a sweep orders and
        # filters by, one metric's summaries of a whole experiment (an index-only scan the read joins).
        indexes = [models.Index(fields=["experiment", "metric"], include=["work_unit", "eid", "last", "min", "max"],
                                name="metric_summary_xid_metric_idx")]
