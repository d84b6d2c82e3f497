"""One row per running interval of an execution: what usage is summed from.

Written only by the database: the triggers of migration ``0001_initial``
(`usage.models.RunningInterval`) open a row when a status history row moves an
execution into a running state (`RUNNING_STATES`) and close it when one moves
it out, or when a restart archives the execution. The settle task
(`usage.services.settle`) later stores the interval's mean GPU utilisation.
docs/architecture/usage.md explains the joins and formulas.
"""
from __future__ import annotations

from django.db import models

from core import limits

#: The states in which an execution holds its resources for usage (its pods run).
RUNNING_STATES = ("RUNNING", "PARTIALLY_FAILED")


class RunningInterval(models.Model):
    #: No database constraint (as ``StatusHistory``): the trigger inserts in the writer's statement, and a
    #: deleted execution's intervals go with it through Django's collector.
    execution = models.ForeignKey("workunits.WorkUnitExecution", on_delete=models.CASCADE, db_constraint=False,
                                  related_name="+", db_index=False)
    #: Denormalised from the execution's work unit and experiment (none of them ever changes).
    experiment_id = models.BigIntegerField()
    wid = models.BigIntegerField()
    eid = models.BigIntegerField()
    owner = models.CharField(max_length=limits.EMAIL, help_text="The experiment's creator.")
    queue = models.CharField(max_length=253, help_text="The LocalQueue the executable names ('' = the default).")
    #: Allocated for the interval, from the executable: replicas x (main container + sidecars).
    gpus = models.BigIntegerField(default=0)
    cpu_millicores = models.BigIntegerField(default=0)
    start_time = models.DateTimeField()
    end_time = models.DateTimeField(null=True, blank=True)
    #: When the execution's previous running interval ended (NULL: this is its first). A period counts
    #: the execution once, on its first interval in the period: one with no previous interval ending
    #: after the period's start (no DISTINCT over the executions of the period).
    previous_end = models.DateTimeField(null=True, blank=True)
    #: Mean ``system/gpu_utilization`` (0-1) over the interval, once settled (NULL: no samples).
    gpu_utilization = models.FloatField(null=True, blank=True)
    settled = models.BooleanField(default=False)

    class Meta:
        db_table = "usage_running_interval"
        indexes = [
            models.Index(fields=["start_time"], name="usage_interval_start_idx"),
            models.Index(fields=["owner", "start_time"], name="usage_interval_owner_idx"),
            models.Index(fields=["execution"], name="usage_interval_execution_idx"),
            models.Index(fields=["end_time"], name="usage_interval_unsettled_idx",
                         condition=models.Q(settled=False)),
        ]
        constraints = [
            models.UniqueConstraint(fields=["execution"], condition=models.Q(end_time__isnull=True),
                                    name="usage_interval_one_open"),
        ]

    def __str__(self) -> str:
        return f"experiments/{self.experiment_id}/workUnits/{self.wid}/executions/{self.eid} {self.start_time}"
