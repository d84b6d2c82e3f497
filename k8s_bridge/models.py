"""The bridge's own rows: archived container logs (`PodLogArchive`).

Written only by `k8s_bridge.logs.archive` (the reconciler's archiver thread
claims, writes and marks rows); read by `k8s_bridge.logs.service` to serve an
execution's logs once its pods are gone. See docs/architecture/logs.md.
"""
from __future__ import annotations

from django.db import models


class PodLogArchive(models.Model):
    """One container instance's log (pod uid, container, restart count), archived once."""

    class Status(models.TextChoices):
        PENDING = "PENDING", "pending"
        ARCHIVED = "ARCHIVED", "archived"
        #: the pod (or that instance) was gone before its log could be read
        LOST = "LOST", "lost"

    xid = models.BigIntegerField()
    wid = models.BigIntegerField()
    eid = models.BigIntegerField()
    namespace = models.CharField(max_length=253)
    pod_name = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    container = models.CharField(max_length=253)
    #: the container's restartCount when this instance ran (0 = first)
    attempt = models.IntegerField(default=0)
    #: ``<replicatedJob>-<jobIndex>`` (``-<podIndex>`` when a job has several pods)
    replica = models.CharField(max_length=300)
    #: the instance had terminated when archived (False: a snapshot taken before the pod was deleted)
    finished = models.BooleanField(default=True)
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=128, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.IntegerField(default=0, help_text="archive tries so far")
    next_try_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    url = models.TextField(blank=True, default="", help_text="where the archived text is (fsspec URL)")
    bytes = models.BigIntegerField(default=0)
    truncated = models.BooleanField(default=False, help_text="only the last XMC_LOG_ARCHIVE_MAX_BYTES were kept")
    #: the last lines (a few KiB), for the failure card of a failed container
    tail = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pod_uid", "container", "attempt"], name="podlogarchive_unique_instance"),
        ]
        indexes = [
            models.Index(fields=["xid", "wid", "eid"], name="podlogarchive_execution_idx"),
            models.Index(fields=["status", "next_try_at"], name="podlogarchive_pending_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod_name}/{self.container}#{self.attempt}"
