"""Operators' admin for work units, executions, operations and the state record.

Thin: every change goes through ``workunits.services`` (admin actions stop
and restart call the same functions as the API). Audit fields and the state
record are read-only; nothing here saves a stateful model itself.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from workunits import services, timeline
from workunits.choices import ExecutionState, WorkUnitState
from workunits.models import (
    DeadLetter,
    Operation,
    PausedTask,
    SchedulingSwitch,
    StatusHistory,
    StatusMessage,
    WorkUnit,
    WorkUnitExecution,
)
from xmc.errors import ServiceError


class ReadOnlyAdminMixin:
    """The row is a record: visible, never edited or added by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def requester(request: HttpRequest) -> services.Requester:
    user = request.user
    return services.Requester(email=getattr(user, "email", "") or f"admin:{user.get_username()}")


def _current_state() -> Subquery:
    return Subquery(
        WorkUnitExecution.objects.filter(work_unit=OuterRef("pk"), execution_state=ExecutionState.ACTIVE)
        .values("state")[:1]
    )


class CurrentStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Iterable[tuple[str, str]]:
        return WorkUnitState.choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkUnit]) -> QuerySet[WorkUnit]:
        if self.value():
            return queryset.filter(executions__execution_state=ExecutionState.ACTIVE,
                                   executions__state=self.value())
        return queryset


class ExecutionInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = WorkUnitExecution
    extra = 0
    fields = ("eid", "execution_state", "state", "create_time", "update_time", "complete_time",
              "system_message", "user_message")
    readonly_fields = fields
    ordering = ("-eid",)
    show_change_link = True


def _run_per_work_unit(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[WorkUnit],
                       verb: str, fn: Any) -> None:
    done, failed = 0, []
    for wu in queryset.order_by("experiment_id", "wid"):
        try:
            fn(wu.experiment_id, [wu.wid], batch=False, requester=requester(request))
            done += 1
        except ServiceError as exc:
            failed.append(f"{wu.name}: {exc.message}")
    if done:
        modeladmin.message_user(request, f"{verb} {done} work unit(s).", messages.SUCCESS)
    for line in failed:
        modeladmin.message_user(request, line, messages.ERROR)


@admin.action(description="Stop selected work units")
def stop_work_units(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[WorkUnit]) -> None:
    _run_per_work_unit(modeladmin, request, queryset, "Stopping", services.stop_work_units)


@admin.action(description="Restart selected work units")
def restart_work_units(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[WorkUnit]) -> None:
    _run_per_work_unit(modeladmin, request, queryset, "Restarted", services.restart_work_units)


def execution_timeline(ex: WorkUnitExecution) -> SafeString:
    """The execution's states over time as a server-drawn SVG (workunits.timeline)."""
    rows = [(h.time, h.to_state) for h in ex.history.all()]
    end = ex.complete_time or timezone.now()
    picture = timeline.svg(timeline.segments(rows, end), title=f"execution {ex.eid}: states over time")
    return mark_safe(picture)  # noqa: S308 - every text in it is escaped by timeline.svg


class MessageInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = StatusMessage
    extra = 0
    fields = ("create_time", "execution_id", "severity", "source", "kind", "content")
    readonly_fields = fields
    ordering = ("-id",)
    verbose_name_plural = "status messages"


@admin.register(WorkUnit)
class WorkUnitAdmin(admin.ModelAdmin):
    list_display = ("__str__", "current_state", "work_unit_type", "priority", "current_eid", "create_time")
    list_filter = (CurrentStateFilter, "work_unit_type", "priority")
    search_fields = ("experiment__id", "experiment__title", "tags")
    readonly_fields = ("experiment", "wid", "work_unit_type", "priority", "create_time", "update_time", "urls",
                       "executable", "tags", "notes", "current_eid", "timelines")
    inlines = [ExecutionInline, MessageInline]
    actions = [stop_work_units, restart_work_units]
    list_select_related = ("experiment",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkUnit]:
        return super().get_queryset(request).annotate(_current_state=_current_state())

    @admin.display(description="state", ordering="_current_state")
    def current_state(self, obj: WorkUnit) -> str:
        return getattr(obj, "_current_state", "") or ""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="timeline")
    def timelines(self, obj: WorkUnit) -> SafeString:
        executions = obj.executions.prefetch_related("history").order_by("-eid")
        return format_html_join(
            "", '<div class="xmc-execution-timeline" data-eid="{}"><p><a href="{}">execution {}</a> ({}, {})</p>{}</div>',
            ((ex.eid, f"../../workunitexecution/{ex.pk}/change/", ex.eid, ex.state, ex.execution_state,
              execution_timeline(ex)) for ex in executions),
        )


class HistoryInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = StatusHistory
    extra = 0
    fields = ("time", "from_state", "to_state", "writer", "operation", "request_id", "extra")
    readonly_fields = fields


@admin.register(WorkUnitExecution)
class WorkUnitExecutionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "execution_state", "state", "update_time", "complete_time")
    list_filter = ("state", "execution_state")
    search_fields = ("work_unit__experiment__id",)
    inlines = [HistoryInline]
    list_select_related = ("work_unit",)
    readonly_fields = ("timeline",)

    @admin.display(description="timeline")
    def timeline(self, obj: WorkUnitExecution) -> SafeString:
        return format_html('<div class="xmc-execution-timeline" data-eid="{}">{}</div>', obj.eid,
                           execution_timeline(obj))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_staff


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "target", "action_type", "task_type", "done", "create_time", "end_time",
                    "dispatched_time", "original_requester")
    list_filter = ("action_type", "task_type", "done")
    search_fields = ("target", "original_requester")


@admin.register(StatusHistory)
class StatusHistoryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("execution", "time", "from_state", "to_state", "writer")
    list_filter = ("to_state", "writer")


@admin.register(StatusMessage)
class StatusMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "experiment", "work_unit", "execution_id", "severity", "source", "create_time")
    list_filter = ("severity", "source", "kind")


@admin.register(PausedTask)
class PausedTaskAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "task_type", "created_time", "resolution_status", "processed_time",
                    "resumption_run_id")
    list_filter = ("task_type", "resolution_status")


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("task_name", "task_type", "error_code", "attempts", "created_time", "requeued_time")
    list_filter = ("task_type", "error_code")


@admin.register(SchedulingSwitch)
class SchedulingSwitchAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "reason", "changed_by", "changed_time")
