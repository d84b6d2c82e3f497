"""Operators' view of the log archive: one row per archived container instance (read-only)."""
from __future__ import annotations

from django.contrib import admin

from k8s_bridge.models import PodLogArchive
from workunits.admin import ReadOnlyAdminMixin


@admin.register(PodLogArchive)
class PodLogArchiveAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("xid", "wid", "eid", "replica", "pod_name", "container", "attempt", "status", "attempts",
                    "bytes", "truncated", "archived_at")
    list_filter = ("status", "truncated", "finished")
    search_fields = ("pod_name", "pod_uid", "namespace")
    readonly_fields = [f.name for f in PodLogArchive._meta.fields]
