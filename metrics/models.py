"""Dashboards, charts and metric points.

* `Chart`: plot specs over one work unit's metrics (``cloud.xmanager.v1.Chart``),
  named ``experiments/{xid}/workUnits/{wid}/charts/{chart_id}``; its access is
  its experiment's.
* `Dashboard`: an ordered list of charts (`DashboardChart`) owned by one user.
* `MetricPoint`: one (execution, metric, step) value -- the narrow table the
  write path fills (`metrics.services.write_points`) and GetChartData reads
  (`metrics.data`). Unique on (execution, metric, step): a replayed batch
  does not double points.

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
    dashboard_id = models.CharField(max_length=ID_LENGTH, unique=True)
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

    def __str__(self) -> str:
        return f"dashboards/{self.dashboard_id}"

    @property
    def name(self) -> str:
        return f"dashboards/{self.dashboard_id}"


class Chart(models.Model):
    chart_id = models.CharField(max_length=ID_LENGTH, unique=True)
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
    """One value of one metric at one step of one execution (narrow: no text but the metric)."""

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey("workunits.WorkUnitExecution", on_delete=models.CASCADE,
                                  related_name="metric_points", db_index=False)
    metric = models.CharField(max_length=METRIC_NAME)
    step = models.BigIntegerField()
    value = models.FloatField()
    time = models.DateTimeField()

    class Meta:
        constraints = [
            # The b-tree every chart query walks (execution, metric, step order),
            # and the idempotency key of the write path.
            models.UniqueConstraint(fields=["execution", "metric", "step"], name="metric_point_once"),
        ]
        indexes = [BrinIndex(fields=["time"], name="metric_point_time_brin")]
