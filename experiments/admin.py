"""Operators' admin for experiments: a read view, edits through the service."""
from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from core import pb
from experiments import services
from experiments.models import Experiment

EDITABLE = ("title", "notes", "tags")


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("name", "title", "creator", "priority", "launch_state", "active_state", "create_time")
    list_filter = ("active_state", "launch_state", "priority")
    search_fields = ("title", "creator", "tags")
    fields = ("title", "notes", "tags", "creator", "priority", "acls", "launch_state", "active_state",
              "child_state_counts", "message_severity_counts", "create_time", "update_time", "complete_time")
    readonly_fields = tuple(f for f in fields if f not in EDITABLE)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # experiments are created by clients (CreateExperiment)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the experiment is the record of its work units

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: dict[str, Any] | None = None) -> Any:
        # The admin wraps this view in a transaction; the service opens its own
        # durable one (it is the single writer), so run the form outside it.
        return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined]

    def save_model(self, request: HttpRequest, obj: Experiment, form: Any, change: bool) -> None:
        # Route the edit through the service (one writer of Experiment rows).
        changed = [f for f in EDITABLE if f in form.changed_data]
        if not changed:
            return
        message = pb.experiment.Experiment(title=obj.title, notes=obj.notes, tags=list(obj.tags))
        services.update_experiment(obj.id, message, changed)
        self.message_user(request, f"Updated {', '.join(changed)}.", messages.SUCCESS)
