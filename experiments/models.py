"""The Experiment: what a client launches, its ACLs and its status roll-up.

Rows are written only by ``experiments.services`` (and the roll-up it applies
for ``workunits.services``). Fields mirror ``cloud.xmanager.v1.Experiment``;
nested messages (ACLs, URLs, resources, structured status message) are kept
as proto3 JSON dicts produced by ``core.convert``.
"""
from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.fields.json import KeyTransform

from core import limits
from core.choices import Priority
from experiments.choices import ActiveState, LaunchState


def _empty_dict() -> dict[str, int]:
    return {}


class Experiment(models.Model):
    # The primary key is the xid (positive int64, server assigned).
    id = models.BigAutoField(primary_key=True, verbose_name="xid")
    title = models.CharField(max_length=limits.TITLE, blank=True, default="")
    creator = models.CharField(max_length=limits.EMAIL, help_text="Verified email of the creator.")
    acls = models.JSONField(default=dict, blank=True, help_text="XidAcls as proto3 JSON.")
    priority = models.CharField(max_length=16, choices=Priority.choices, default=Priority.NORMAL)
    create_time = models.DateTimeField()
    update_time = models.DateTimeField()
    complete_time = models.DateTimeField(null=True, blank=True)
    urls = models.JSONField(default=list, blank=True)
    tags = ArrayField(models.CharField(max_length=limits.TAG), default=list, blank=True)
    notes = models.TextField(blank=True, default="")
    resources = models.JSONField(default=list, blank=True)

    # ExperimentStatus
    active_state = models.CharField(max_length=16, choices=ActiveState.choices, default=ActiveState.ACTIVE)
    launch_state = models.CharField(max_length=16, choices=LaunchState.choices, default=LaunchState.LAUNCHING)
    launch_id = models.CharField(max_length=limits.LAUNCH_ID, blank=True, default="")
    #: WorkUnitState name -> number of work units whose current execution is in it.
    child_state_counts = models.JSONField(default=_empty_dict, blank=True)
    #: Severity name -> number of work units whose highest current message has it.
    message_severity_counts = models.JSONField(default=_empty_dict, blank=True)
    last_child_status_update_time = models.DateTimeField(null=True, blank=True)
    status_update_time = models.DateTimeField()
    structured_status_message = models.JSONField(null=True, blank=True)

    #: Highest work unit id handed out so far (allocator for CreateWorkUnit without an id).
    last_wid = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["creator", "-create_time"], name="experiment_creator_idx"),
            models.Index(fields=["-create_time"], name="experiment_create_time_idx"),
            models.Index(fields=["active_state"], name="experiment_active_state_idx"),
            models.Index(fields=["launch_state"], name="experiment_launch_state_idx"),
            GinIndex(fields=["tags"], name="experiment_tags_gin"),
            # experiments.acl.readable_q filters lists by containment in each role list.
            GinIndex(KeyTransform("owners", "acls"), name="experiment_acl_owners_gin"),
            GinIndex(KeyTransform("writers", "acls"), name="experiment_acl_writers_gin"),
            GinIndex(KeyTransform("readers", "acls"), name="experiment_acl_readers_gin"),
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(id__gt=0), name="experiment_xid_positive"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def xid(self) -> int:
        return self.id

    @property
    def name(self) -> str:
        return f"experiments/{self.id}"
