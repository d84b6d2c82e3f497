"""Operators' admin for artifacts (read-only record; clients write them)."""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from artifacts.models import Artifact


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ("name", "experiment", "work_unit", "data_type", "payload_kind", "lifecycle_phase", "create_time")
    list_filter = ("lifecycle_phase", "data_type", "payload_kind")
    search_fields = ("tags", "notes")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
