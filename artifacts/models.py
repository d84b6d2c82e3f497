"""Artifacts attached to an experiment or a work unit (``cloud.xmanager.v1.Artifact``).

Written only by ``artifacts.services``. Nested messages are proto3 JSON.
"""
from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models

from core import limits


class LifecyclePhase(models.TextChoices):
    INPUT = "INPUT"
    EXECUTION = "EXECUTION"
    OUTPUT = "OUTPUT"


class Artifact(models.Model):
    id = models.BigAutoField(primary_key=True, verbose_name="aid")
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="artifacts")
    work_unit = models.ForeignKey("workunits.WorkUnit", on_delete=models.CASCADE, null=True, blank=True,
                                  related_name="artifacts")
    url = models.JSONField(default=dict, blank=True)
    acls = models.JSONField(default=dict, blank=True)
    tags = ArrayField(models.CharField(max_length=limits.TAG), default=list, blank=True)
    notes = models.TextField(blank=True, default="")
    lifecycle_phase = models.CharField(max_length=16, choices=LifecyclePhase.choices, default=LifecyclePhase.INPUT)
    #: Artifact.DataType name (DATA_UNSPECIFIED, URL, CODE_SOURCE, ...).
    data_type = models.CharField(max_length=32, default="DATA_UNSPECIFIED")
    mime_type = models.CharField(max_length=limits.MIME_TYPE, blank=True, default="")
    additional_info = models.JSONField(null=True, blank=True)
    #: ArtifactPayload as proto3 JSON; its oneof key names the kind.
    payload = models.JSONField(null=True, blank=True)
    #: Which payload kind is set (managed_xprof, code_source, text, url, chart) or "".
    payload_kind = models.CharField(max_length=24, blank=True, default="")
    priority = models.IntegerField(default=0)
    create_time = models.DateTimeField()
    update_time = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["experiment", "work_unit", "-id"], name="artifact_parent_idx"),
            models.Index(fields=["payload_kind"], name="artifact_payload_kind_idx"),
            GinIndex(fields=["tags"], name="artifact_tags_gin"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        return f"artifacts/{self.id}"

    @property
    def parent(self) -> str:
        if self.work_unit is not None:
            return f"experiments/{self.experiment_id}/workUnits/{self.work_unit.wid}"
        return f"experiments/{self.experiment_id}"
